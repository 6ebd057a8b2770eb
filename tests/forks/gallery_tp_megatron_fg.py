"""Megatron-LM's hand-written tensor parallelism (``mappings.copy_to_tensor_model_parallel_region`` /
``reduce_from_tensor_model_parallel_region``, the f and g of the Megatron paper), re-expressed over DTensor
shards: weights are ``Shard`` DTensors, the compute runs on their local tensors between f and g.

Correct. A check that judged placements or styles would not know it: there is no ``parallelize_module`` here.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The attention and MLP split Megatron's way: f before each column-parallel layer, g after each row one."""
    return megatron(model, tp_mesh)
