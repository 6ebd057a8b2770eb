"""Broken gather fork: the forward leaves out the last rank's rows (an off-by-one in the concatenation).

Otherwise ``upstream_style_gather``, whose autograd function it reuses. The
conformance suite must fail it on the core tier with the shrunk example and
the per-rank difference.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.forks.upstream_style_gather import _active, _AllGatherWithGrad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


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
