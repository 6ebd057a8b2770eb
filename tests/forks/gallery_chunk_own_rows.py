"""Gallery fork: a concatenating gather whose backward takes its own chunk of its own gradient.

Pattern: an autograd Function that all-gathers into a list and returns
the concatenation; backward splits the upstream gradient into W
chunks and returns this rank's chunk. Bug: no cross-rank sum, so rank r gets
only g_r's rows for r.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllGatherCat"]


class AllGatherCat(torch.autograd.Function):
    """All-gather concatenated on dim 0; backward returns this rank's chunk unsummed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.chunk(dist.get_world_size())[dist.get_rank()].contiguous().clone()  # BUG: no sum over ranks
