"""Broken gather fork: backward reduces float64 gradients in float32 (cast, all-reduce, cast back).

A pattern of public code that halves the traffic of the reduction, or works
around a backend without float64. Otherwise ``upstream_style_gather``: the
forward is exact and every integer-valued gradient survives the round trip,
so only full-mantissa float64 values show the lost precision. The
conformance suite must fail it on the core tier, and name the cause: reduced
in float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks import upstream_style_gather
from tests.forks.upstream_style_gather import _active, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def lossy_function(wide: torch.dtype, narrow: torch.dtype) -> type[torch.autograd.Function]:
    """An all-gather on dim 0 whose backward all-reduces ``wide`` gradients in ``narrow`` and keeps this rank's rows."""

    class _LossyReduction(upstream_style_gather._AllGatherWithGrad):
        """upstream_style_gather's Function (its forward), the backward reducing ``wide`` in ``narrow``."""

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
            stacked = torch.stack([g.contiguous() for g in grads])
            if stacked.dtype == wide:
                reduced = stacked.to(narrow)  # BUG: mantissa bits cut before the sum
                dist.all_reduce(reduced)
                stacked = reduced.to(wide)
            else:
                dist.all_reduce(stacked)
            return stacked[dist.get_rank()]

    return _LossyReduction


_AllGatherWithGrad = lossy_function(torch.float64, torch.float32)


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return torch.cat(_AllGatherWithGrad.apply(x), dim=0)
