"""Broken gather fork: backward reduces float32 gradients in bfloat16 (cast, all-reduce, cast back).

A pattern of public code that compresses gradients for the reduction, as
DDP's bf16 compression hook does. Otherwise ``upstream_style_gather``: the
forward is exact and small integer-valued gradients survive the round trip,
so only full-mantissa float32 values show the lost precision. The
conformance suite must fail it on the core tier, and name the cause: reduced
in bfloat16.
"""

from __future__ import annotations

import torch

from tests.forks.broken_gather_reduces_float64_in_float32 import lossy_function
from tests.forks.upstream_style_gather import _active, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]

_AllGatherWithGrad = lossy_function(torch.float32, torch.bfloat16)


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return torch.cat(_AllGatherWithGrad.apply(x), dim=0)
