"""Broken DDP fork (test fixture): ``activation_checkpointing`` is ignored by ``parallelize``.

Guarded by ``ddp.activation_checkpointing_full`` / ``_selective``: no block runs again in backward.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that it never checkpoints."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap like the reference but skip activation checkpointing (the deliberate bug)."""
        return parallelize_ddp(model, dataclasses.replace(self.config, activation_checkpointing=False), device=self.device)
