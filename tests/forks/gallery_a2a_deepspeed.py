"""DeepSpeed's (and fairscale's) mixture-of-experts ``_AllToAll``: ``forward(ctx, group, input)`` splits dim 0
equally over the group, and backward applies the same equal exchange to the gradient.

Correct. An autograd Function given no split sizes: the suite checks it on equal splits only
(``--a2a-fn tests.forks.gallery_a2a_deepspeed:_AllToAll``; ``group`` and ``input`` are filled by name).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import exchange


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: Any, input: torch.Tensor) -> torch.Tensor:
        ctx.group = group
        return exchange(input, None, None, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, _AllToAll.apply(ctx.group, grad)
