"""Gallery wrapper, broken: the hand-written data parallel whose ``no_sync`` does not stop the all-reduce.

Bug: ``no_sync()`` is offered (a trainer calls it for gradient accumulation)
but does nothing, so every micro-batch is all-reduced. The gradient still
comes out right (reducing each micro-batch and summing equals reducing the
sum); the communication ``no_sync`` exists to skip is not skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, with a ``no_sync`` that syncs anyway."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """BUG: nothing is switched off."""
        yield
