"""Gallery wrapper, broken: the hand-written data parallel that broadcasts nothing at start.

Bug: each rank keeps the weights it built; the averaged gradients then move
ranks that never agreed, so they never become one model.
"""

from __future__ import annotations

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, without the broadcast from rank 0."""

    def start(self) -> None:
        """BUG: no broadcast."""
