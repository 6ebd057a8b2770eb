"""Sequence parallelism with the norms left plain (torchtitan 2217, Megatron-LM 1446): activations travel as
local sequence shards, so each rank's norm sees its own tokens only and its weight's gradient is a partial sum
that nobody reduces. The forward is right; the norms train on part of their gradient.

Broken: tp.gradients_equal_unsharded fails, naming replicated gradients left partial per rank.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

from tests.forks._tensor_parallel import local_heads, retie


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """torchtitan's sequence-parallel plan with no style on any norm."""
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    local_heads(model, tp_mesh.size())
    return retie(model)
