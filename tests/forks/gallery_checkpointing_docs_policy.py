"""Checkpointing gallery: the save-matmuls policy of torch's documentation, on each block's attention and MLP.

Pattern (the example policy of ``torch.utils.checkpoint.create_selective_checkpoint_contexts``'s
documentation, re-expressed): ``MUST_SAVE`` for ``aten.mm``, ``aten.addmm`` and
``aten.bmm``, ``PREFER_RECOMPUTE`` for everything else, applied with
``checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=...)``
on each selected block's attention and MLP (full checkpointing: the same
wrapper without a policy). Correct: it conforms.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, op_policy

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]

_SAVED = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]
#: A block's attention and MLP, by the attribute names of the suites' models and of transformers' blocks.
_CHILDREN = ("attn", "self_attn", "attention", "mlp", "feed_forward")


def _policy(ctx: object, op: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpoint(block: nn.Module, mode: str) -> None:
    for name in _CHILDREN:
        child = getattr(block, name, None)
        if isinstance(child, nn.Module):
            extra = {"context_fn": op_policy(_policy)} if mode == "selective" else {}
            setattr(block, name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra))


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "torch's documented save-matmuls policy on each block's attention and MLP"
)
