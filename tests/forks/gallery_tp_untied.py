"""Tied weights broken by ``parallelize_module`` (transformers PRs 47503, 48938): the embedding and the head are
sharded one after the other, each weight replaced by a DTensor of its own, and nothing ties them again, so they
train apart.

Broken: tp.tied_embeddings_stay_tied fails.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split of the layers; the embedding row-wise and the head column-wise, not re-tied."""
    megatron(model, tp_mesh)
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    return model
