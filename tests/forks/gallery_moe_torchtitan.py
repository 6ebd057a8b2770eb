"""torchtitan's expert parallelism: experts sharded ``Shard(0)`` over the expert-parallel mesh, (token, expert)
pairs sorted by owning rank, the counts exchanged, tokens sent with ``all_to_all_single_autograd`` and brought
back the same way.

Correct. ``--moe-fn tests.forks.gallery_moe_torchtitan:apply_ep``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard the experts and dispatch tokens to them."""
    return dispatched(layer, ep_mesh)
