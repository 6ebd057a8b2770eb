"""Broken DDP fork (test fixture): ``activation_checkpointing="selective"`` saves every op, recomputing nothing.

Guarded by ``ddp.activation_checkpointing_selective``: a selected block must run
at least one of its non-matmul ops again during backward. Here each selected
block is checkpointed with a policy that saves every op's output, so the
block's ``forward`` runs again but every op in it is answered from the cache:
fewer matmuls than full checkpointing (none), and no memory saved.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from nemo_dist.distributed import ddp as _reference
from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing

__all__ = ["DDPManager", "parallelize_ddp"]


def _save_every_op(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The deliberate bug: every op's output is saved, none recomputed."""
    return CheckpointPolicy.MUST_SAVE


def parallelize_ddp(model: nn.Module, config: Any, *, device: torch.device | None = None) -> DistributedDataParallel:
    """The reference ``parallelize_ddp``, except that selective checkpointing saves every op (the deliberate bug)."""
    if config.activation_checkpointing != "selective":
        return _reference.parallelize_ddp(model, config, device=device)
    # The reference selects and wraps the blocks (as for full); the wrappers then get the save-all policy.
    apply_activation_checkpointing(model, "full", config.activation_checkpointing_scope)
    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_every_op)
    for module in model.modules():
        if isinstance(module, CheckpointWrapper):
            module.checkpoint_fn = functools.partial(checkpoint, use_reentrant=False, context_fn=context_fn)
    return _reference.parallelize_ddp(model, dataclasses.replace(config, activation_checkpointing=False), device=device)


class DDPManager(_reference.DDPManager):
    """The reference manager, except that its selective policy saves every op."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap through this fork's :func:`parallelize_ddp`."""
        return parallelize_ddp(model, self.config, device=self.device)
