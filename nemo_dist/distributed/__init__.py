"""Distributed training: DDP (``DDPConfig``, ``parallelize_ddp``, ``DDPManager``), FSDP2 and activation checkpointing.

The FSDP2 names (``FSDP2Config``, ``FSDP2Manager``, ``fsdp2_strategy_parallelize``,
``get_sync_ctx``, ``ParallelismSizes``, ``create_fsdp2_device_mesh``) are imported
on first access: ``torch.distributed.fsdp`` brings ``torch.distributed.tensor``
and sympy (about a second per process), which a DDP user should not pay.
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_dist.distributed.config import DDPConfig
from nemo_dist.distributed.ddp import DDPManager, parallelize_ddp

__all__ = [
    "DDPConfig",
    "DDPManager",
    "FSDP2Config",
    "FSDP2Manager",
    "ParallelismSizes",
    "create_fsdp2_device_mesh",
    "fsdp2_strategy_parallelize",
    "get_sync_ctx",
    "parallelize_ddp",
]

#: Lazily exported name -> the module defining it.
_LAZY = {
    "FSDP2Config": "nemo_dist.distributed.fsdp2_config",
    "FSDP2Manager": "nemo_dist.distributed.fsdp2",
    "fsdp2_strategy_parallelize": "nemo_dist.distributed.fsdp2",
    "get_sync_ctx": "nemo_dist.distributed.fsdp2",
    "ParallelismSizes": "nemo_dist.distributed.mesh",
    "create_fsdp2_device_mesh": "nemo_dist.distributed.mesh",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
