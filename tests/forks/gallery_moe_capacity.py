"""Expert parallelism with a capacity: each expert takes at most 2 (token, expert) pairs a step and the rest are
dropped (their expert output zero), as GShard, Switch and DeepSpeed's ``capacity_factor`` do. In training that is a
choice; against one process with no capacity it is a difference, and the suite names it.

Differs from one process: forward and what follows fail, naming the dropped pairs.
``--moe-fn tests.forks.gallery_moe_capacity:apply_ep``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched, local_mlp

CAPACITY = 2


def within_capacity(rows: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Each row through its local expert; an expert's rows past its first :data:`CAPACITY` give zeros."""
    out = local_mlp(rows, local, w1, w2)
    kept = torch.zeros(local.shape[0], dtype=torch.bool)
    for e in torch.unique(local).tolist():
        kept[torch.nonzero(local == e).reshape(-1)[:CAPACITY]] = True
    return out * kept.to(out.dtype).reshape(-1, 1)


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, each expert capped at CAPACITY pairs."""
    return dispatched(layer, ep_mesh, compute=within_capacity)
