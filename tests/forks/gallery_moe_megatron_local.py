"""Megatron-core's local experts, re-expressed: each rank builds only its own experts as plain parameters (rank r
holds experts ``r * E / W`` to ``(r + 1) * E / W - 1``, no DTensor saying so), and tokens reach them by the
autograd all-to-all dispatch (counts exchanged first). The suite finds which experts a rank holds from their
values and reads them whole.

Correct. ``--moe-fn tests.forks.gallery_moe_megatron_local:apply_ep``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Plain local experts in blocks by rank, tokens dispatched to the block's owner."""
    return dispatched(
        layer, ep_mesh, held=lambda rank, size, count: list(range(rank * count // size, (rank + 1) * count // size))
    )
