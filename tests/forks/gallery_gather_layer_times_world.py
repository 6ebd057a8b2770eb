"""Gallery fork: the ``GatherLayer`` pattern whose backward scales the sum by the world size.

Pattern: as the summed ``GatherLayer``, but the summed gradient is multiplied
by the world size (meant to cancel DDP's later averaging). Bug: rank r gets W
times the contract's sum.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.gallery_gather_layer_summed import GatherLayer as _SummedGatherLayer

__all__ = ["GatherLayer"]


class GatherLayer(_SummedGatherLayer):
    """All-gather into a tuple of W tensors (as the summed layer); backward scales the sum by the world size."""

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()] * dist.get_world_size()  # BUG: scaled by W
