"""Broken gather fork: the backward ``view``s an upstream gradient that may be non-contiguous.

Otherwise ``upstream_style_gather``. ``Tensor.view`` raises inside this
file for a transposed or strided gradient; the conformance suite must show
this file and line in the failure's traceback (the tool's frames folded).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.upstream_style_gather import _active, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


class _ViewingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        size = dist.get_world_size()
        flat = grad.view(-1)  # BUG: raises for a non-contiguous gradient (reshape would copy)
        summed = flat.reshape(size, -1).clone()
        dist.all_reduce(summed)
        return summed[dist.get_rank()].reshape(grad.shape[0] // size, *grad.shape[1:])


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return _ViewingBackward.apply(x)
