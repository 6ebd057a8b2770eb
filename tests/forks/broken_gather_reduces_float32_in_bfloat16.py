"""Broken gather fork: backward reduces float32 gradients in bfloat16 (cast, all-reduce, cast back).

A pattern of public code that compresses gradients for the reduction, as
DDP's bf16 compression hook does. Otherwise ``upstream_style_gather``: the
forward is exact and small integer-valued gradients survive the round trip,
so only full-mantissa float32 values show the lost precision. The
conformance suite must fail it on the core tier, and name the cause: reduced
in bfloat16.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.upstream_style_gather import _active, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather on dim 0; backward all-reduces the gradients (float32 ones in bfloat16) and keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        if stacked.dtype == torch.float32:
            reduced = stacked.bfloat16()  # BUG: 24 mantissa bits cut to 8 before the sum
            dist.all_reduce(reduced)
            stacked = reduced.float()
        else:
            dist.all_reduce(stacked)
        return stacked[dist.get_rank()]


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return torch.cat(_AllGatherWithGrad.apply(x), dim=0)
