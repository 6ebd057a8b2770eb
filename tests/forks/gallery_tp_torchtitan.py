"""torchtitan's Llama plan (``parallelize_llama``'s ``apply_tp``), re-expressed: sequence parallelism with
``SequenceParallel`` norms, ``PrepareModuleInput`` gathering the sequence before attention and the MLP, row-wise
outputs reduce-scattered onto the sequence, vocabulary-sharded logits for ``loss_parallel``.

Correct.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from tests.forks._tensor_parallel import local_heads, retie


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Embedding, norms, head and every layer's attention and MLP, as torchtitan shards a Llama."""
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    local_heads(model, tp_mesh.size())
    return retie(model)  # parallelize_module replaced each weight on its own
