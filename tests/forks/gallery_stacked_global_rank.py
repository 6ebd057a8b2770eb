"""Gallery fork: Lightning-style stacked ``AllGather`` indexing the gradient by the GLOBAL rank.

Pattern: an autograd Function taking an optional process group; forward
gathers into a stacked ``[group_size, *x.shape]`` tensor; backward all-reduces
the gradient over the group and returns the entry at ``dist.get_rank()``.
Correct in the whole world. Bug: inside a subgroup the global rank is not the
group rank, so a member gets another member's gradient, or an IndexError when
its global rank is >= the group's size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllGather"]


class AllGather(torch.autograd.Function):
    """Stacked all-gather over ``group``; backward sums over the group and indexes by global rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any = None) -> torch.Tensor:
        ctx.group = group
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank()], None  # BUG: global rank, not dist.get_rank(ctx.group)
