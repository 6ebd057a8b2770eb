"""Broken DDP fork (test fixture): activation checkpointing wraps frozen blocks too.

Guarded by ``ddp.activation_checkpointing_full``: a block with no trainable
parameter is left alone (upstream filters the layer groups to trainable blocks),
so it must not run again in backward.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing
from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that frozen blocks are checkpointed like trainable ones."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Checkpoint the selected blocks as if every parameter were trainable (the deliberate bug), then wrap."""
        if self.activation_checkpointing:
            frozen = [p for p in model.parameters() if not p.requires_grad]
            for parameter in frozen:
                parameter.requires_grad_(True)
            apply_activation_checkpointing(model, self.activation_checkpointing, self.activation_checkpointing_scope)
            for parameter in frozen:
                parameter.requires_grad_(False)
        config = dataclasses.replace(self.config, activation_checkpointing=False)
        return parallelize_ddp(model, config, device=self.device)
