"""Checkpointing gallery: torch's ``apply_activation_checkpointing`` with a ``check_fn`` on whole blocks.

Pattern (FSDP and torchtune recipes, re-expressed):
``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing(
model, checkpoint_wrapper_fn=..., check_fn=lambda m: m is block)`` replaces
the block inside its parent; the wrapper function carries the save-matmuls
policy under selective. Correct: it conforms.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


class _Holder(nn.Module):
    """A parent for the block, so that torch's helper has a slot to replace it in."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    holder = _Holder(block)
    extra = {"context_fn": save_matmuls} if mode == "selective" else {}
    apply_activation_checkpointing(
        holder, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, **extra), check_fn=lambda m: m is block
    )
    return holder.block


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "torch's apply_activation_checkpointing with a check_fn, on whole blocks"
)
