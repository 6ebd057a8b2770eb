"""Gallery fork: a gather returning a list of W tensors whose own slot is ``x`` itself. Correct.

Pattern (contrastive losses that keep the local features' graph): the other
ranks' tensors come from ``dist.all_gather`` inside an autograd Function, and
this rank's slot is replaced by ``x`` itself so its gradient flows directly.
The Function's backward sums every rank's gradient for this rank's slot (its
own upstream gradient for that slot arrives as zeros, ``x`` gets it directly),
so the gradient rule holds. Under ``torch.no_grad()`` the list still holds
``x``, which requires grad: only a concatenation done under no-grad too is
outside autograd.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_list"]


class _OtherRanks(torch.autograd.Function):
    """All-gather into W tensors; backward sums every rank's gradient for this rank's slot."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()]


def gather_list(x: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``x`` in rank order, as a list; this rank's entry is ``x`` itself."""
    parts = list(_OtherRanks.apply(x))
    parts[dist.get_rank()] = x
    return parts
