"""Broken DDP fork (test fixture): ``bucket_cap_mb=None`` becomes 1 MiB instead of torch's default (25 MiB).

Guarded by ``ddp.bucket_cap_mb``: with None, DDP's cap must be torch's own default.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from nemo_dist.distributed.config import DDPConfig
from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp as _reference_parallelize

__all__ = ["DDPManager", "parallelize_ddp"]


def parallelize_ddp(model: nn.Module, config: DDPConfig, *, device: torch.device | None = None) -> nn.Module:
    """The reference's wrapping, with None read as 1 MiB (the deliberate bug)."""
    if config.bucket_cap_mb is None:
        config = dataclasses.replace(config, bucket_cap_mb=1.0)
    return _reference_parallelize(model, config, device=device)


class DDPManager(_ReferenceManager):
    """The reference manager wrapping through the broken ``parallelize_ddp``."""

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Wrap through this fork's ``parallelize_ddp``."""
        return parallelize_ddp(model, self.config, device=self.device)
