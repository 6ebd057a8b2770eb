"""Correct fork (test fixture): checkpointing right, its blocks computing out of sight of dispatch modes.

Each selected block is checkpointed on the whole (full, or torch's
documented save-matmuls policy under selective), and each of its
sub-modules computes with every ``TorchDispatchMode`` switched off, as a
region compiled or run by a custom kernel may hide its ops from them. Its
recompute and gradients are right; what the op counters of the
checkpointing checks see of its blocks is nothing. Those checks must then
say that they could not observe (NOT APPLICABLE, naming the block), never
FAIL it.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils._python_dispatch import _disable_current_modes

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


class _Hidden(nn.Module):
    """``module`` run with the dispatch modes off."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return self.module(*args, **kwargs)


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    for name, child in list(block.named_children()):
        setattr(block, name, _Hidden(child))
    return checkpoint_wrapper(block, context_fn=save_matmuls) if mode == "selective" else checkpoint_wrapper(block)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "every sub-module of a checkpointed block computing with the dispatch modes off"
)
