"""Gallery fork: the ``GatherLayer`` pattern whose backward averages instead of summing.

Pattern: as the summed ``GatherLayer``, but after the SUM all-reduce the
gradient is divided by the world size, written to "undo" DDP's gradient
averaging. Bug: rank r gets the mean over s of g_s's rows for r, the
contract's sum divided by W.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GatherLayer"]


class GatherLayer(torch.autograd.Function):
    """All-gather into a tuple of W tensors; backward averages the gradients over ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        stacked /= dist.get_world_size()  # BUG: mean, not sum
        return stacked[dist.get_rank()]
