"""What the composed expert-parallel gallery rows share: ep borrowed from data parallelism, reductions by hook.

The mesh is the suite's ``(edp, ep)`` one (``--moe-mesh edp,ep``): the experts are ``Shard(0)`` over the ep sub-mesh
and tokens are dispatched within each ep group (:func:`tests.forks._experts.dispatched`); every rank has its own
tokens, so the data-parallel size is the world. After backward a hook reduces each parameter's gradient over the
group a row names and divides it by the divisor the row names: the pieces public code gets wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tests.forks._experts import dispatched

#: ``(world, ep, edp) -> divisor``.
Divisor = Callable[[int, int, int], float]


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
    layer: nn.Module, mesh: Any, *, experts_over: str | None = "edp", experts_divisor: Divisor = lambda w, ep, edp: w,
    dense_over: str | None = "world", dense_divisor: Divisor = lambda w, ep, edp: w,
) -> nn.Module:
    """``layer`` under ep on ``mesh["ep"]``; expert gradients summed over ``experts_over`` ("edp", "world" or None)
    and divided by ``experts_divisor``; the router's over ``dense_over`` ("world", "ep" or None), divided by
    ``dense_divisor``. The defaults make the mean over every data-parallel rank: right under ``--moe-reduction
    mean``."""
    ep_mesh = mesh["ep"]
    dispatched(layer, ep_mesh)
    world, ep, edp = dist.get_world_size(), mesh["ep"].size(), mesh["edp"].size()
    groups = {"edp": mesh["edp"].get_group(), "ep": ep_mesh.get_group(), "world": dist.group.WORLD, None: None}
    for param in layer.experts.parameters():
        _reduce_by_hook(param, groups[experts_over], experts_divisor(world, ep, edp))
    for param in layer.router.parameters():
        _reduce_by_hook(param, groups[dense_over], dense_divisor(world, ep, edp))
    return layer
