"""Checkpointing gallery: Megatron-style selective recompute, the core attention only.

Pattern (Megatron-LM's ``--recompute-granularity selective``, re-expressed as
an op policy): only the core of attention is recomputed (the score
products, the softmax, the fused attention kernels), every other op's output
(the projections, the MLP, the norms) is saved. Whole blocks. Full: the
wrapper alone. Correct: it conforms.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, op_policy

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]

_aten = torch.ops.aten
#: The core attention's ops: score and value products, softmax, the fused kernels.
_CORE = {
    getattr(_aten, name)
    for name in ("bmm", "baddbmm", "_softmax", "_safe_softmax", "softmax", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention")
    if hasattr(_aten, name)
}


def _policy(ctx: object, op: object) -> CheckpointPolicy:
    recompute = getattr(op, "overloadpacket", op) in _CORE
    return CheckpointPolicy.MUST_RECOMPUTE if recompute else CheckpointPolicy.MUST_SAVE


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    return checkpoint_wrapper(block, context_fn=op_policy(_policy)) if mode == "selective" else checkpoint_wrapper(block)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, 'Megatron-style recompute of the core attention only, on whole blocks'
)
