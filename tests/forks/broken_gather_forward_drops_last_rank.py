"""Broken gather fork: the forward leaves out the last rank's rows (an off-by-one in the concatenation).

Otherwise a correct copy of ``upstream_style_gather``. The conformance suite
must fail it on the core tier with the shrunk example and the per-rank
difference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather on dim 0; backward all-reduces the gradients and keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked)
        return stacked[dist.get_rank()]


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    parts = _AllGatherWithGrad.apply(x)
    return torch.cat(parts[:-1], dim=0)  # BUG: drops the last rank


def all_gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 without autograd."""
    if not _active():
        return x.detach()
    with torch.no_grad():
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts[:-1], dim=0)  # BUG: drops the last rank
