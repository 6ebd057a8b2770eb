"""Gallery wrapper, broken: the hand-written data parallel that all-reduces the gradients in bfloat16.

Bug, as written to halve the traffic: each gradient is cast to bfloat16,
all-reduced and averaged there, and copied back, so the reduced gradients
carry bfloat16's 8-bit mantissa whatever the model's dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, reducing in bfloat16."""

    def reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """BUG: the average over the ranks, computed in bfloat16."""
        low = grad.to(torch.bfloat16)
        dist.all_reduce(low)
        return grad.copy_(low.div_(dist.get_world_size()))
