"""Broken gather fork: backward all-reduces only this rank's own slot of its upstream gradient.

Otherwise ``upstream_style_gather``. Rank r takes rows ``slot r`` of its own
upstream gradient and all-reduces them, so every rank receives
``sum_s g_s[slot s]`` (each rank's own-slot gradient, summed) instead of
``sum_s g_s[slot r]``. The conformance suite must fail it on the core tier
and name this wrong-slice pattern as the likely cause.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.upstream_style_gather import _active, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


class _OwnSlotReduced(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        own = grad.chunk(dist.get_world_size())[dist.get_rank()].contiguous().clone()
        dist.all_reduce(own)  # BUG: sums the ranks' own slots, not every rank's rows for this slot
        return own


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return _OwnSlotReduced.apply(x)
