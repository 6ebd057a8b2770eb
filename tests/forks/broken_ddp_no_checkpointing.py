"""Broken DDP fork (test fixture): ``activation_checkpointing`` is ignored by ``parallelize``.

Guarded by ``ddp.activation_checkpointing_full`` / ``_selective``: no block runs again in backward.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that it never checkpoints."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap like the reference but skip activation checkpointing (the deliberate bug)."""
        mode, self.activation_checkpointing = self.activation_checkpointing, False
        try:
            return super().parallelize(model)
        finally:
            self.activation_checkpointing = mode
