"""Local experts placed round-robin: rank r holds experts r, r + W, r + 2W, ... as plain parameters, and the
dispatch sends expert e's tokens to rank ``e % W``, which runs them through its local expert ``e // W``. A
placement no ``Shard`` describes; the suite reads it from the experts' values.

Correct. ``--moe-fn tests.forks.gallery_moe_local_round_robin:apply_ep``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Plain local experts round-robin by rank, tokens dispatched round-robin."""
    return dispatched(
        layer, ep_mesh, held=lambda rank, size, count: list(range(rank, count, size)),
        owner=lambda e, _per, size: e % size, local=lambda e, _per, size: e // size,
    )
