"""A row-parallel layer that adds its bias on every rank before the all-reduce (a hand-written row-parallel
linear calling ``F.linear(x, weight_shard, bias)``), so the bias is counted tensor-parallel-size times. Megatron's
``RowParallelLinear`` adds it after the reduction.

Broken: tp.forward_equals_unsharded fails. Checked on the suite's tiny Llama with a bias on ``o_proj``
(``--tp-model tests.forks.gallery_tp_bias_before_allreduce:model``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from tests.forks._tensor_parallel import _ReduceFromRegion, megatron, tiny_model


def model() -> nn.Module:
    """The suite's tiny Llama with a bias on attention's output projection."""
    return tiny_model(o_proj_bias=True)


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split; each biased output projection row-parallel with its bias inside the reduction."""
    megatron(model, tp_mesh)  # leaves biased layers alone
    group = tp_mesh.get_group()
    for layer in model.model.layers:
        linear = layer.self_attn.o_proj
        linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), tp_mesh, [Shard(1)]))

        def forward(x: torch.Tensor, linear: nn.Linear = linear) -> torch.Tensor:
            return _ReduceFromRegion.apply(F.linear(x, linear.weight.to_local(), linear.bias), group, False)

        linear.forward = forward  # type: ignore[method-assign]
    return model
