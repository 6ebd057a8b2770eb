"""Checkpointing gallery: the save-matmuls policy spelled PREFER_SAVE / MUST_RECOMPUTE.

Pattern (the other two of torch's four ``CheckpointPolicy`` values, as
policies written for ``torch.compile`` use them): matmuls ``PREFER_SAVE``,
everything else ``MUST_RECOMPUTE``. Eager checkpointing treats PREFER_SAVE as
MUST_SAVE. Whole blocks. Correct: it conforms.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, is_matmul, op_policy

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


def _policy(ctx: object, op: object) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_SAVE if is_matmul(op) else CheckpointPolicy.MUST_RECOMPUTE


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    return checkpoint_wrapper(block, context_fn=op_policy(_policy)) if mode == "selective" else checkpoint_wrapper(block)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, 'matmuls PREFER_SAVE, the rest MUST_RECOMPUTE, on whole blocks'
)
