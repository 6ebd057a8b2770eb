"""Gallery fork: ``gather_reversed`` returns the ranks in reverse order.

Pattern: a hand-rolled gather (an off-by-one in a ring, say) that lays the
ranks out last to first. The autograd path is consistent with that layout:
a list all-gather through a function whose backward sums over ranks, then
the parts concatenated in reverse, so the gradient of x on rank r is the sum
over s of g_s's rows at position W-1-r. Bug: rank order reversed, in forward
and backward alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_reversed"]


class _GatherParts(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()]


def gather_reversed(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated on dim 0, last rank first."""
    parts = _GatherParts.apply(x)
    return torch.cat(parts[::-1], dim=0)  # BUG: ranks in reverse order
