"""Gallery wrapper, broken: the hand-written data parallel syncing buffers from the last rank, not rank 0.

Bug: the source rank of the buffer broadcast written as ``world_size - 1``
(at construction and before every forward), so every rank ends up with the
last rank's buffers. In a world of 2, rank 1 sees its own values, as a
wrapper keeping buffers local would show there; rank 0 and a world of 3
tell them apart.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["DataParallel"]


class DataParallel(_DataParallel):
    """As the hand-written one, broadcasting buffers from the last rank at start and before each forward."""

    def start(self) -> None:
        """Parameters from rank 0; BUG: buffers from the last rank."""
        for p in self.module.parameters():
            dist.broadcast(p.data, src=0)
        self._sync_buffers()

    def _sync_buffers(self) -> None:
        for b in self.module.buffers():
            dist.broadcast(b.data, src=dist.get_world_size() - 1)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_buffers()
        return self.module(*args, **kwargs)
