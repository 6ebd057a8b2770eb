"""Checkpointing gallery: ``torch.utils.checkpoint.checkpoint`` called inside the block's own forward.

Pattern (models that checkpoint themselves, as Hugging Face's
``GradientCheckpointingLayer`` and many training scripts do, re-expressed):
no wrapper module; each selected block's ``forward`` calls
``checkpoint(original_forward, *args, use_reentrant=False, **kwargs)``, with
the save-matmuls policy as ``context_fn`` under selective. Correct: it
conforms.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


def _checkpointed(original: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
    extra = {"context_fn": save_matmuls} if mode == "selective" else {}
    return checkpoint(original, *args, use_reentrant=False, **extra, **kwargs)


def _checkpoint(block: nn.Module, mode: str) -> None:
    block.forward = functools.partial(_checkpointed, block.forward, mode)  # type: ignore[method-assign]


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "torch.utils.checkpoint.checkpoint called in each selected block's forward"
)
