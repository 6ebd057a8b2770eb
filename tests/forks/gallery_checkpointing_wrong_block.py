"""Checkpointing gallery, broken: each selected block's successor is checkpointed instead (an off-by-one).

Pattern (an index slip over the block list, re-expressed): the fork selects
the right blocks, then wraps the entry after each one in its list, so the
first selected block of a group runs once and the block after the last
(another group's, or a frozen one) is recomputed. The policy itself is the
documented save-matmuls one. Guarded by the checkpointing checks: a
selected block that does not run again.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls, select_blocks

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


def _next_blocks(model: nn.Module, scope: Any) -> list[tuple[nn.Module, str, nn.Module]]:
    """The entry after each selected block in its list (the deliberate bug)."""
    shifted = []
    for parent, attribute, _ in select_blocks(model, scope):
        following = str(int(attribute) + 1) if attribute.isdigit() else None
        if following is not None and following in parent._modules:
            shifted.append((parent, following, parent._modules[following]))
    return shifted


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    return checkpoint_wrapper(block, context_fn=save_matmuls) if mode == "selective" else checkpoint_wrapper(block)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "each selected block's successor checkpointed instead (the deliberate bug)", _next_blocks
)
