"""Local experts built afresh on each rank: every rank creates its own experts' weights with its own random draw
(``torch.randn`` after seeding by rank, as a model constructed per rank before any checkpoint load does) instead of
taking the unsharded layer's, then dispatches as Megatron's local experts do. Nothing is shared, so nothing fails
to run: the outputs are simply another model's.

Broken: every moe check fails; the first names the sharding that changed the weights.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatch_forward


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Plain local experts in blocks by rank, drawn anew per rank, tokens dispatched to the block's owner."""
    experts = layer.experts
    per_rank = experts.w1.shape[0] // ep_mesh.size()
    generator = torch.Generator().manual_seed(1000 + ep_mesh.get_local_rank())
    for name in ("w1", "w2"):
        full = getattr(experts, name)
        fresh = torch.randn((per_rank, *full.shape[1:]), generator=generator, dtype=full.dtype) / full.shape[1] ** 0.5
        setattr(experts, name, nn.Parameter(fresh.to(full.device)))
    layer.experts.forward = types.MethodType(dispatch_forward(per_rank, ep_mesh.get_group()), layer.experts)
    return layer
