"""Checkpointing gallery: TorchTitan-style op-level selective checkpointing, a save list and every other matmul.

Pattern (torchtitan's ``_apply_op_sac``, re-expressed): a save list of ops
(the linear layers' matmul, the attention kernels, the reduce-scatter of a
sharded gradient, ``aten.max``); every second linear matmul of a region is
recomputed all the same; anything not on the list is recomputed. torchtitan's
models have no biases, so its list names ``aten.mm``; here ``aten.addmm``
(a biased linear layer's matmul) counts as the same op, and torch's CPU flash
kernel joins the CUDA ones. Without that, on a block whose every linear layer
has a bias and whose attention runs no listed kernel (Qwen2-VL's vision
blocks on CPU), the list saves nothing, which the contract rightly calls full
checkpointing. Applied with torch's checkpoint wrapper on whole blocks, RNG
state not preserved (no dropout here). Full: the wrapper alone. Correct: it
conforms.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]

_aten = torch.ops.aten
_SAVE_LIST = {
    op
    for op in (
        _aten.mm.default,
        _aten.addmm.default,
        getattr(_aten, "_scaled_dot_product_efficient_attention", None),
        getattr(_aten, "_scaled_dot_product_flash_attention", None),
        # torch's CPU flash kernel, where the tool runs: the same role as the CUDA kernels torchtitan lists.
        getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None),
        getattr(torch.ops, "_c10d_functional", None) and torch.ops._c10d_functional.reduce_scatter_tensor.default,
        _aten.max.default,
    )
    if op is not None
}


def _policy(meta: dict[str, int], ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    key = f"{getattr(ctx, 'is_recompute', False)}_mm_count"
    linear = op in (_aten.mm.default, _aten.addmm.default)
    if linear:
        meta[key] = meta.get(key, 0) + 1
    to_save = op in _SAVE_LIST and not (linear and meta[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE


def _context() -> object:
    return create_selective_checkpoint_contexts(functools.partial(_policy, {}))


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    if mode == "selective":
        return checkpoint_wrapper(block, context_fn=_context, preserve_rng_state=False)
    return checkpoint_wrapper(block, preserve_rng_state=False)


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, "torchtitan's op-level save list, every other mm recomputed, on whole blocks"
)
