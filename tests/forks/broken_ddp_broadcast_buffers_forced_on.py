"""Broken DDP fork (test fixture): ``broadcast_buffers`` is always True.

Guarded by ``ddp.broadcast_buffers``: with False, each rank keeps its own buffers, at construction too.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, broadcast_buffers=True),
    "The reference manager, except that buffers are always synced from rank 0.",
)
