"""A tied embedding and head sharded on the hidden dim instead of the vocabulary: the embedding column-wise
(``ColwiseParallel`` on ``nn.Embedding``, its output gathered), the head row-wise on the same weight, so both
hold ``Shard(1)`` of the one tensor. The layers are split Megatron's way.

Correct, although its placements are not the usual ``Shard(0)`` vocabulary split a placement check expects.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.forks._tensor_parallel import megatron, retie


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Embedding and head on the hidden dim (tied again), layers Megatron's way."""
    megatron(model, tp_mesh)
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": ColwiseParallel(output_layouts=Replicate()),
        "lm_head": RowwiseParallel(input_layouts=Replicate()),
    })
    return retie(model)
