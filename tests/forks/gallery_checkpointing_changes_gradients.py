"""Checkpointing gallery, broken: a block whose recompute differs from its forward, so gradients change.

Pattern (a stateful forward under checkpointing: a step counter, a running
statistic or dropout with its RNG state not preserved, re-expressed as a
scale that reads a call counter): the forward computes as the plain model
does, the recompute in backward sees another count and scales the block's
input, and backward differentiates what the recompute saved. The gradients differ by about 1e-3;
the recompute counts look right. Guarded by the checkpointing checks'
gradient comparison, whose likely cause names it.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


class _Counting(nn.Module):
    """The block, its input scaled by 1 on odd calls and by 1.001 on even ones (the deliberate bug)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        scale = 1.0 if self.calls % 2 else 1.001
        return self.block(args[0] * scale, *args[1:], **kwargs)


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    extra = {"context_fn": save_matmuls} if mode == "selective" else {}
    return checkpoint_wrapper(_Counting(block), **extra)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, 'a block whose recompute reads a call counter (the deliberate bug)'
)
