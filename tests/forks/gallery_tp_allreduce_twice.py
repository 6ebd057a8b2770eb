"""An autograd all-reduce whose backward reduces again (the reduce-from-region g written as
``torch.distributed.nn.functional.all_reduce``, whose backward is itself an all-reduce): every gradient before a
row-parallel layer comes back multiplied by the tensor-parallel size.

Broken: tp.gradients_equal_unsharded fails.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split with g all-reducing in backward too."""
    return megatron(model, tp_mesh, g_reduces_again=True)
