"""Megatron-core's local experts, re-expressed: each rank builds only its own experts as plain parameters (rank r
holds experts ``r * E / W`` to ``(r + 1) * E / W - 1``, no DTensor saying so), and tokens reach them by the
autograd all-to-all dispatch (counts exchanged first). The suite finds which experts a rank holds from their
values and reads them whole.

Correct. ``--moe-fn tests.forks.gallery_moe_megatron_local:apply_ep``.
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn

from tests.forks._experts import dispatch_forward, local_experts


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Plain local experts in blocks by rank, tokens dispatched to the block's owner."""
    per_rank = local_experts(layer, ep_mesh, lambda rank, size, count: list(
        range(rank * count // size, (rank + 1) * count // size)
    ))
    layer.experts.forward = types.MethodType(dispatch_forward(per_rank, ep_mesh.get_group()), layer.experts)
    return layer
