"""What the composed expert-parallel gallery rows share: ep borrowed from data parallelism, reductions by hook.

The mesh is the suite's ``(edp, ep)`` one (``--moe-mesh edp,ep``) or ``(edp, ep, tp)`` (``edp,ep,tp``, the ranks of
a tp group sharing one batch of tokens). The experts are ``Shard(0)`` over the ep sub-mesh and tokens are
dispatched within each ep group (:func:`tests.forks._experts.dispatched`). After backward a hook reduces each
parameter's gradient over the mesh dims a row names and divides it by the divisor the row names: the pieces public
code gets wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tests.forks._experts import dispatched

#: The layout's sizes (``W``, ``edp``, ``ep``, ``tp``, and ``dp``: the world over tp) -> a divisor.
Divisor = Callable[[dict[str, int]], float]


def _data_parallel(sizes: dict[str, int]) -> float:
    return sizes["dp"]


def sizes_of(mesh: Any) -> dict[str, int]:
    """``mesh``'s dim sizes by name, with ``W`` (the world), ``tp`` (1 without a tp dim) and ``dp`` (W / tp)."""
    found = {name: mesh[name].size() for name in mesh.mesh_dim_names}
    found.setdefault("tp", 1)
    found.update(W=dist.get_world_size(), dp=dist.get_world_size() // found["tp"])
    return found


_GROUPS: dict[tuple[Any, ...], Any] = {}


def group_over(mesh: Any, dims: Sequence[str] | None) -> Any:
    """The process group of this rank over ``mesh``'s ``dims`` (None: no group; every dim: the world). Groups of
    several dims are made once per mesh shape, on every rank in the same order (a collective)."""
    if dims is None:
        return None
    names = tuple(mesh.mesh_dim_names)
    if set(dims) == set(names):
        return dist.group.WORLD
    if len(dims) == 1:
        return mesh[dims[0]].get_group()
    key = (tuple(mesh.mesh.shape), names, tuple(dims))
    if key not in _GROUPS:
        order = [names.index(d) for d in names if d not in dims] + [names.index(d) for d in dims]
        width = math.prod(mesh[d].size() for d in dims)
        _GROUPS[key] = dist.new_subgroups_by_enumeration(mesh.mesh.permute(order).reshape(-1, width).tolist())[0]
    return _GROUPS[key]


def _reduce_by_hook(param: torch.Tensor, group: Any, divisor: float) -> None:
    """After each backward, ``param``'s local gradient summed over ``group`` (None: not reduced), then divided."""

    def reduce(p: torch.Tensor) -> None:
        with torch.no_grad():
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            assert grad is not None
            if group is not None:
                dist.all_reduce(grad, group=group)
            grad.div_(divisor)

    param.register_post_accumulate_grad_hook(reduce)


def composed(
    layer: nn.Module, mesh: Any, *, experts_over: Sequence[str] | None = ("edp",),
    experts_divisor: Divisor = _data_parallel, dense_over: Sequence[str] | None = ("edp", "ep"),
    dense_divisor: Divisor = _data_parallel, **routing: Any,
) -> nn.Module:
    """``layer`` under ep on ``mesh["ep"]`` (``routing``: :func:`~tests.forks._experts.dispatch_forward`'s
    keywords); expert gradients summed over the mesh dims ``experts_over`` and divided by ``experts_divisor``; the
    router's over ``dense_over``, divided by ``dense_divisor``. The defaults make the mean over the data-parallel
    ranks (a tp group's ranks compute the same gradients from the same batch): right under ``--moe-reduction
    mean``."""
    dispatched(layer, mesh["ep"], **routing)
    sizes = sizes_of(mesh)
    for params, over, divisor in ((layer.experts.parameters(), experts_over, experts_divisor),
                                  (layer.router.parameters(), dense_over, dense_divisor)):
        group, by = group_over(mesh, over), divisor(sizes)
        for param in params:
            _reduce_by_hook(param, group, by)
    return layer
