"""Gallery wrapper: the hand-written data parallel that sums the gradients instead of averaging them.

A bug under the default ``--ddp-reduction mean`` (the gradients are W times
one process's on the full batch); with ``--ddp-reduction sum`` it is what
was declared and conforms.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, all-reducing with SUM and no division."""

    def reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """The sum of ``grad`` over the ranks."""
        dist.all_reduce(grad)
        return grad
