"""Broken gather fork: each rank's output leaves out that rank's own rows (it gathers only the others').

Otherwise ``upstream_style_gather``, whose autograd function it reuses. The
conformance suite must fail it on the core tier and say that each rank's own
rows are missing (not one rank's: every rank misses a different block).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.forks.upstream_style_gather import _active, _AllGatherWithGrad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def _others(parts: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
    rank = dist.get_rank()
    return torch.cat([p for r, p in enumerate(parts) if r != rank], dim=0)  # BUG: skips this rank's own rows


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return _others(_AllGatherWithGrad.apply(x))


def all_gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 without autograd."""
    if not _active():
        return x.detach()
    with torch.no_grad():
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return _others(parts)
