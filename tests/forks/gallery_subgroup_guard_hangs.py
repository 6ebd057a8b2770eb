"""Gallery fork: group ``GroupGather`` whose backward guard uses the global rank, and hangs in subgroups.

Pattern: an autograd Function taking an optional process group; forward
returns a tuple of group_size tensors; backward stacks the gradients and,
behind a check meant to skip ranks outside the group, all-reduces over the
group and returns this rank's group entry, else returns its own slice
unsummed. Bug: the check is ``dist.get_rank() < group_size`` with the GLOBAL
rank. In the whole world it always holds and the result is correct. In a
subgroup whose members include global ranks >= its size (e.g. group [1, 2] of
a world of 3), those members skip the all-reduce while the others wait in it
forever: backward HANGS.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GroupGather"]


class GroupGather(torch.autograd.Function):
    """Tuple all-gather over ``group``; backward's global-rank guard desynchronises a subgroup."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any = None) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        stacked = torch.stack([g.contiguous() for g in grads])
        rank = dist.get_rank(ctx.group)
        if dist.get_rank() < dist.get_world_size(ctx.group):  # BUG: global rank in the guard
            dist.all_reduce(stacked, op=dist.ReduceOp.SUM, group=ctx.group)
        return stacked[rank], None
