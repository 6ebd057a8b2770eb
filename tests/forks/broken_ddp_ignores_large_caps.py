"""Broken DDP fork (test fixture): a ``bucket_cap_mb`` of 1 MiB or more is dropped (torch's default instead).

Every cap over about 0.05 MiB gives the same single bucket on the check's
model, so only DDP's own cap in bytes tells them apart. Guarded by
``ddp.bucket_cap_mb``, whose caps go up to 100 MiB.
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
    """The reference's wrapping, a cap of 1 MiB or more replaced by torch's default (the deliberate bug)."""
    if config.bucket_cap_mb is not None and config.bucket_cap_mb >= 1:
        config = dataclasses.replace(config, bucket_cap_mb=None)
    return _reference_parallelize(model, config, device=device)


class DDPManager(_ReferenceManager):
    """The reference manager wrapping through the broken ``parallelize_ddp``."""

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Wrap through this fork's ``parallelize_ddp``."""
        return parallelize_ddp(model, self.config, device=self.device)
