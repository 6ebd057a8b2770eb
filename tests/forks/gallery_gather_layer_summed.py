"""Gallery fork: the ``GatherLayer`` pattern with a summed backward. Correct.

Pattern: an autograd Function that all-gathers ``x`` into a list and returns
the W tensors as a tuple; backward stacks the upstream gradients, all-reduces
them with SUM and keeps this rank's entry, which is what a reduce-scatter gives.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GatherLayer"]


class GatherLayer(torch.autograd.Function):
    """All-gather into a tuple of W tensors; backward sums every rank's gradient for this rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()]
