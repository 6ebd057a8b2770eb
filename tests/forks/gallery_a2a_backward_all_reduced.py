"""DeepSpeed-style equal-split ``_AllToAll`` (``forward(ctx, group, input)``) whose backward all-reduces the routed
gradient over the group, as if the expert gradients were data-parallel ones: each rank's rows get the sum of every
rank's gradient for its position.

Broken: a2a.backward_returns_each_row_its_gradient fails, naming the reduction (each rank's gradient is the sum of
every rank's right one). ``--a2a-fn tests.forks.gallery_a2a_backward_all_reduced:_AllToAll``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks import gallery_a2a_deepspeed
from tests.forks._all_to_all import exchange


class _AllToAll(gallery_a2a_deepspeed._AllToAll):
    """DeepSpeed's equal-split exchange forward; a backward that all-reduces what it routes."""

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        routed = exchange(grad, None, None, ctx.group)
        dist.all_reduce(routed, group=ctx.group)
        return None, routed
