"""Experts placed round-robin by the dispatch (expert e to rank e mod W) while the weights are sharded in
contiguous blocks (``Shard(0)``): tokens reach a rank that holds another expert under that local index.

Broken: moe.forward_equals_one_process fails (and every check after it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched


def _round_robin(experts: torch.Tensor, per_rank: int, size: int) -> torch.Tensor:
    return experts % size


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch with the owner computed round-robin."""
    return dispatched(layer, ep_mesh, owner=_round_robin)
