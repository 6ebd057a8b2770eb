"""Upstream-faithful gather fork (test fixture): ``dist_utils`` as NeMo Automodel 0.7.0 documents it.

Written from upstream 0.7.0's documented behaviour; no upstream or nemo_dist
code is copied or imported.  Forward is a list all-gather returned as a tuple,
backward stacks the gradients, all-reduces them and keeps this rank's slice.
Both functions return ``x`` itself (not a copy, not detached) when there is
nothing to gather.  No ``group=``, no ``uneven=``, no 0-d check: it must
conform on the core tier and show the extended keywords as not supported.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def _single_process() -> bool:
    """True when there is no other rank to gather from."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1


class _AllGatherWithGrad(torch.autograd.Function):
    """Gather on dim 0 as a tuple of W tensors in rank order; backward sums the gradients over ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not (dist.is_available() and dist.is_initialized()):
            ctx.world_size = 1
            return (x,)
        ctx.world_size = dist.get_world_size()
        gathered = [torch.zeros_like(x) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, x.contiguous())
        return tuple(gathered)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        if ctx.world_size == 1:
            return grads[0]
        summed = torch.stack(grads).contiguous()
        dist.all_reduce(summed)
        return summed[dist.get_rank()]


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated on dim 0, differentiable; ``x`` itself when alone."""
    if _single_process():
        return x
    return torch.cat(_AllGatherWithGrad.apply(x), dim=0)


def all_gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated on dim 0, outside autograd; ``x`` itself when alone."""
    if _single_process():
        return x
    with torch.no_grad():
        gathered = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, x.contiguous())
    return torch.cat(gathered, dim=0)
