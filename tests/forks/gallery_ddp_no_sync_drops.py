"""Gallery wrapper, broken: the hand-written data parallel whose ``no_sync`` drops the gradients.

Bug: "skip the sync" written as "drop the gradient" (``param.grad = None``
under ``no_sync``), so gradient accumulation keeps only the synced
micro-batch's gradient.
"""

from __future__ import annotations

import torch

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, clearing the gradient of a backward under ``no_sync``."""

    def skipped(self, param: torch.Tensor) -> None:
        """BUG: the gradient is dropped instead of kept for the synced backward."""
        param.grad = None
