"""A fused query-key-value projection held as a strided shard (torch's ``_StridedShard(0, split_factor=3)``, what
FSDP2 and TP use for a weight sharded twice on one dim): each rank holds its own heads' rows of all three parts,
so the local output splits into its queries, keys and values, and ``full_tensor()`` is the fused weight in its
original order. The rest is split Megatron's way.

Correct, although its placement is no plain ``Shard(0)`` (a placement check expecting one would fail it).
Checked on the suite's tiny Llama with a fused ``qkv_proj`` and as many key-value heads as heads
(``--tp-model tests.forks.gallery_tp_fused_qkv_strided:model``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from nemo_dist.conformance.suites.tp.models import TinyConfig, TinyLlamaForCausalLM
from tests.forks._tensor_parallel import _CopyToRegion, megatron


class _FusedAttention(nn.Module):
    """Multi-head attention with one fused ``qkv_proj`` (queries, keys, values stacked on the output dim)."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.num_heads = self.num_key_value_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        width = self.num_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length = x.shape[0], x.shape[1]
        q, k, v = (
            part.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
            for part in self.qkv_proj(x).chunk(3, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


def model() -> nn.Module:
    """The suite's tiny Llama, 8 heads and 8 key-value heads, its attention fused."""
    config = TinyConfig(num_key_value_heads=8)
    built = TinyLlamaForCausalLM(config)
    for layer in built.model.layers:
        layer.self_attn = _FusedAttention(config)
    return built.to(torch.float64)


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Each fused projection a strided shard over the group (its heads of q, k and v on each rank)."""
    group = tp_mesh.get_group()
    for layer in model.model.layers:
        linear = layer.self_attn.qkv_proj
        strided = [_StridedShard(0, split_factor=3)]
        linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), tp_mesh, strided))

        def forward(x: torch.Tensor, linear: nn.Linear = linear) -> torch.Tensor:
            weight = linear.weight.to_local() if isinstance(linear.weight, DTensor) else linear.weight
            return F.linear(_CopyToRegion.apply(x, group, True), weight)

        linear.forward = forward  # type: ignore[method-assign]
    megatron(model, tp_mesh)  # o_proj and the MLP
    for layer in model.model.layers:
        layer.self_attn.num_heads //= tp_mesh.size()
    return model
