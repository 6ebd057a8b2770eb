"""Broken DDP fork (test fixture): ``activation_checkpointing`` is ignored in worlds of more than two ranks.

Guarded by ``ddp.activation_checkpointing_full`` / ``_selective`` in a world of 3, where those checks check a
sample of their scopes (the whole matrix runs in the run's smallest world of two or more): the sample still
sees that no block runs again in backward. In a world of 2 the fork checkpoints as the reference does.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that it never checkpoints with more than two ranks."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap like the reference; skip activation checkpointing beyond two ranks (the deliberate bug)."""
        config = self.config
        if dist.get_world_size() > 2:
            config = dataclasses.replace(config, activation_checkpointing=False)
        return parallelize_ddp(model, config, device=self.device)
