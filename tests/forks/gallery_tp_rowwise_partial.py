"""A row-wise layer whose output is handed on as each rank's partial sum (its all-reduce dropped, as a custom
``RowwiseParallel._prepare_output_fn`` that returns ``to_local()`` of the ``Partial`` result does).

Broken: tp.forward_equals_unsharded fails.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.forks._tensor_parallel import PartialRowwise, local_heads, retie


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Attention's output projection left partial; the rest as the Megatron-style plan shards it."""
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "model.layers.*.self_attn.q_proj": ColwiseParallel(),
        "model.layers.*.self_attn.k_proj": ColwiseParallel(),
        "model.layers.*.self_attn.v_proj": ColwiseParallel(),
        "model.layers.*.self_attn.o_proj": PartialRowwise(),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    local_heads(model, tp_mesh.size())
    return retie(model)
