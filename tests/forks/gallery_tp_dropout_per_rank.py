"""Dropout seeded per rank inside a tensor-parallel group (a training script calling ``torch.manual_seed(seed +
rank)`` for every rank, which data parallelism wants and tensor parallelism does not): replicated activations get
a different mask on each rank of the group, so the ranks compute different models and their replicated
parameters drift apart.

Broken: tp.forward_equals_unsharded and tp.trains_like_one_process fail. Checked on the suite's tiny Llama with
dropout on attention's output (``--tp-model tests.forks.gallery_tp_dropout_shared:model``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split, each layer reseeding the random state with its rank before it runs."""
    megatron(model, tp_mesh)

    def reseed(module: nn.Module, args: tuple[Any, ...]) -> None:
        torch.manual_seed(1234 + dist.get_rank())

    for layer in model.model.layers:
        layer.register_forward_pre_hook(reseed)
    return model
