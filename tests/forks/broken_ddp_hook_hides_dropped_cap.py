"""Broken DDP fork (test fixture): a lossless comm hook registered, and ``bucket_cap_mb`` never forwarded.

torch's ``allreduce_hook`` changes nothing in the gradients, so only the
buckets show the bug. Guarded by ``ddp.bucket_cap_mb``, which reads the
buckets from DDP itself, whatever hook the code registered.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.config import DDPConfig
from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp as _reference_parallelize

__all__ = ["DDPManager", "parallelize_ddp"]


def parallelize_ddp(model: nn.Module, config: DDPConfig, *, device: torch.device | None = None) -> nn.Module:
    """The reference's wrapping without ``bucket_cap_mb``, then torch's allreduce hook (the deliberate bug)."""
    wrapped = _reference_parallelize(model, dataclasses.replace(config, bucket_cap_mb=None), device=device)
    if isinstance(wrapped, DistributedDataParallel):
        wrapped.register_comm_hook(None, allreduce_hook)
    return wrapped


class DDPManager(_ReferenceManager):
    """The reference manager wrapping through the broken ``parallelize_ddp``."""

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Wrap through this fork's ``parallelize_ddp``."""
        return parallelize_ddp(model, self.config, device=self.device)
