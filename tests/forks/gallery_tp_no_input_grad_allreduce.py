"""Megatron's tensor parallelism with f's backward left out: the gradient of a column-parallel layer's input is
never all-reduced (each rank's covers its own heads or columns only), so everything before the layer trains on a
part of its gradient. A silent bug: the forward is right.

Broken: tp.gradients_equal_unsharded fails.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split with f an identity both ways."""
    return megatron(model, tp_mesh, f_reduces=False)
