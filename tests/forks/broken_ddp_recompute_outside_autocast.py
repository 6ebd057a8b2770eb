"""Broken DDP fork (test fixture): a checkpointed block's recompute runs outside autocast.

Otherwise the reference. Each checkpoint wrapper recomputes under
``torch.autocast(enabled=False)`` (a ``context_fn`` whose recompute context
turns autocast off): the forward's matmuls run in the autocast dtype, the
recomputed ones in float32 (torch's own checkpoint then refuses the
recomputed tensors' changed dtype). Guarded by ``ddp.autocast_dtype``, which
also runs autocast with full and selective checkpointing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing
from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager

__all__ = ["DDPManager"]


def _contexts(device_type: str) -> tuple[Any, Any]:
    return contextlib.nullcontext(), torch.autocast(device_type, enabled=False)  # BUG: recompute without autocast


class DDPManager(_ReferenceManager):
    """The reference manager, its checkpoint wrappers recomputing with autocast off."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Checkpoint as the reference does, swap each wrapper's checkpoint function, then wrap in DDP."""
        config = self.config
        if config.activation_checkpointing:
            apply_activation_checkpointing(model, config.activation_checkpointing, config.activation_checkpointing_scope)
            device_type = "cuda" if self.device is not None and self.device.type == "cuda" else "cpu"
            for wrapper in model.modules():
                if isinstance(wrapper, CheckpointWrapper):
                    wrapper.checkpoint_fn = functools.partial(
                        checkpoint, use_reentrant=False, context_fn=functools.partial(_contexts, device_type)
                    )
            config = dataclasses.replace(config, activation_checkpointing=False)
        return _ReferenceManager(config).parallelize(model)
