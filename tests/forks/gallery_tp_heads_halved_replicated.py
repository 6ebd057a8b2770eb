"""Attention head counts halved while the query, key and value projections stay whole on every rank (AutoModel
PR 1519: a plan that keeps attention replicated, with the head-count update of a head-sharded one).

Broken: the attention reads its head counts, so forward fails on every rank with a shape error, and
tp.attention_head_counts_are_local names the counts.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from tests.forks._tensor_parallel import local_heads
from tests.forks.gallery_tp_mlp_only import PLAN


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The MLP split, attention whole, and the head counts divided anyway."""
    parallelize_module(model, tp_mesh, PLAN)
    local_heads(model, tp_mesh.size())
    return model
