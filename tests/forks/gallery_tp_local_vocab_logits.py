"""The head's local vocabulary shard returned as the logits (``ColwiseParallel()`` on ``lm_head`` with its
default local output): each rank scores its own slice of the vocabulary as if it were all of it (DeepSpeed PR 8302,
AutoModel PR 1087 score such logits with a plain cross entropy).

Broken: tp.forward_equals_unsharded fails (logits of the wrong width).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split of the layers, and a column-wise head whose local output is taken as the logits."""
    megatron(model, tp_mesh)
    parallelize_module(model, tp_mesh, {"lm_head": ColwiseParallel()})
    return model
