"""Expert parallelism borrowed from data parallelism, as torchtitan and upstream lay it out: the world is a
``(dp, ep)`` mesh (ep the world halved where the world is even, else the world), the experts are ``Shard(0)`` over
the ep sub-mesh, tokens are dispatched within each ep group, and each expert shard's gradient is summed over its
``dp`` replicas by a hook (the expert-data-parallel reduction), while the router is left to the data-parallel
reduction of the whole world.

Correct. In a world of 2 each rank's ep mesh is itself alone (every expert on every rank); in a world of 4, ep 2
x dp 2. ``--moe-fn tests.forks.gallery_moe_expert_data_parallel:apply_ep``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tests.forks._experts import dispatched

_MESHES: dict[int, DeviceMesh] = {}


def dp_ep_mesh(size: int) -> DeviceMesh:
    """The ``(dp, ep)`` mesh of a world of ``size`` (made once per world: it creates process groups)."""
    if size not in _MESHES:
        ep = size // 2 if size % 2 == 0 else size
        _MESHES[size] = init_device_mesh("cpu", (size // ep, ep), mesh_dim_names=("dp", "ep"))
    return _MESHES[size]


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Experts over the ep sub-mesh of a ``(dp, ep)`` mesh, their gradients summed over dp after backward."""
    mesh = dp_ep_mesh(dist.get_world_size())
    dispatched(layer, mesh["ep"])
    dp_group = mesh["dp"].get_group()

    def summed_over_dp(param: torch.Tensor) -> None:
        with torch.no_grad():
            dist.all_reduce(param.grad.to_local(), group=dp_group)  # type: ignore[union-attr]

    for param in layer.experts.parameters():
        param.register_post_accumulate_grad_hook(summed_over_dp)
    return layer
