"""Distributed training: ``DDPConfig``, ``parallelize_ddp``, ``DDPManager`` and activation checkpointing."""

from nemo_dist.distributed.config import DDPConfig
from nemo_dist.distributed.ddp import DDPManager, parallelize_ddp

__all__ = ["DDPConfig", "DDPManager", "parallelize_ddp"]
