"""Gallery fork: the SimCLR-style ``GatherLayer`` whose backward keeps only its own gradient.

Pattern: an autograd Function that all-gathers ``x`` into a list and returns
the W tensors as a tuple; backward picks this rank's entry out of the
upstream gradients it received. Bug: no cross-rank sum, so rank r gets only
g_r's rows for r instead of the sum over s of g_s's rows for r. The most
widespread bug of this family.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.gallery_gather_layer_summed import GatherLayer as _SummedGatherLayer

__all__ = ["GatherLayer"]


class GatherLayer(_SummedGatherLayer):
    """All-gather into a tuple of W tensors (as the summed layer); backward returns this rank's own slice unsummed."""

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        return grads[dist.get_rank()]  # BUG: no sum over ranks
