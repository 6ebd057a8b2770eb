"""Gallery fork: the ``GatherLayer`` pattern whose backward averages instead of summing.

Pattern: as the summed ``GatherLayer``, but after the SUM all-reduce the
gradient is divided by the world size, written to "undo" DDP's gradient
averaging. Bug: rank r gets the mean over s of g_s's rows for r, the
contract's sum divided by W.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.gallery_gather_layer_summed import GatherLayer as _SummedGatherLayer

__all__ = ["GatherLayer"]


class GatherLayer(_SummedGatherLayer):
    """All-gather into a tuple of W tensors (as the summed layer); backward averages the gradients over ranks."""

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        stacked /= dist.get_world_size()  # BUG: mean, not sum
        return stacked[dist.get_rank()]
