"""Local experts placed round-robin: rank r holds experts r, r + W, r + 2W, ... as plain parameters, and the
dispatch sends expert e's tokens to rank ``e % W``, which runs them through its local expert ``e // W``. A
placement no ``Shard`` describes; the suite reads it from the experts' values.

Correct. ``--moe-fn tests.forks.gallery_moe_local_round_robin:apply_ep``.
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn

from tests.forks._experts import dispatch_forward, local_experts


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Plain local experts round-robin by rank, tokens dispatched round-robin."""
    per_rank = local_experts(layer, ep_mesh, lambda rank, size, count: list(range(rank, count, size)))
    forward = dispatch_forward(
        per_rank, ep_mesh.get_group(), owner=lambda e, _per, size: e % size, local=lambda e, _per, size: e // size,
    )
    layer.experts.forward = types.MethodType(forward, layer.experts)
    return layer
