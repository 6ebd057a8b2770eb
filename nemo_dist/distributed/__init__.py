"""Distributed training: ``DDPConfig``, ``DDPManager`` and activation checkpointing."""

from nemo_dist.distributed.config import DDPConfig
from nemo_dist.distributed.ddp import DDPManager

__all__ = ["DDPConfig", "DDPManager"]
