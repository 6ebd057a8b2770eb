"""Checkpointing gallery: upstream's selective policy, every other matmul saved, on whole blocks.

Pattern (NeMo AutoModel 0.7.0's selective checkpointing, after TorchTitan's,
re-expressed): each selected block in one non-reentrant ``checkpoint_wrapper``
whose selective context saves the first, third, ... matmul of the region and
the attention kernels, and recomputes every other op; the count restarts in
the recompute so both passes decide alike. Full checkpointing: the same
wrapper without a policy. Correct: it conforms.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, is_matmul

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]

_aten = torch.ops.aten
#: Attention kernels, saved whenever they run (the costliest ops of a block).
_KERNELS = {
    getattr(_aten, name)
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(_aten, name)
}


def _context() -> object:
    """A fresh context pair per checkpointed call: matmuls counted per pass, every odd one saved."""
    counts = {False: 0, True: 0}

    def choose(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if getattr(op, "overloadpacket", op) in _KERNELS:
            return CheckpointPolicy.MUST_SAVE
        if is_matmul(op):
            recompute = bool(getattr(ctx, "is_recompute", False))
            counts[recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(choose)


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    return checkpoint_wrapper(block, context_fn=_context) if mode == "selective" else checkpoint_wrapper(block)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "upstream's alternating policy (every other matmul saved) on whole blocks"
)
