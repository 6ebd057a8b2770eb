"""Broken gather fork: the forward gathers in float32 and returns float32, whatever the input's dtype.

A pattern meant to make half-precision features "safer" for the loss. Otherwise
``upstream_style_gather``, whose autograd function it reuses. The conformance
suite must fail it on the core tier, and name the cause: the dtype changed.
"""

from __future__ import annotations

import torch

from tests.forks.upstream_style_gather import _active, _AllGatherWithGrad, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return torch.cat(_AllGatherWithGrad.apply(x.float()), dim=0)  # BUG: float32 out for any input dtype
