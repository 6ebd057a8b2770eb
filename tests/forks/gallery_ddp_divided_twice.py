"""Gallery wrapper, broken: the hand-written data parallel that divides by the world size twice.

Bug, as written to "pre-scale" for averaging: the gradient is divided by W
before the all-reduce and the averaged result by W again, so each rank gets
the mean divided by W.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, dividing by W before and after the all-reduce."""

    def reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """BUG: the mean over the ranks, divided by W once more."""
        grad.div_(dist.get_world_size())
        dist.all_reduce(grad)
        return grad.div_(dist.get_world_size())
