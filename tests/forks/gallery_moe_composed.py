"""Expert parallelism composed with data parallelism as torchtitan and upstream lay it out: ep borrowed from data
parallelism (``--moe-mesh edp,ep``), experts ``Shard(0)`` over ep and averaged over their expert-data-parallel
replicas and the ep groups alike (summed over edp, divided by the world: torchtitan's ``set_gradient_divide_factor``
over ``dp_mod_ep``), the router averaged over the world; the pieces re-expressed as hooks.

Correct under ``--moe-reduction mean``: ``--moe-fn tests.forks.gallery_moe_composed:apply_ep --moe-mesh edp,ep
--moe-reduction mean``; and ``apply_ep_summed`` under the default sum.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._composition import composed


def apply_ep(layer: nn.Module, mesh: Any) -> nn.Module:
    """Experts over ep, every gradient the mean over the data-parallel ranks."""
    return composed(layer, mesh)


def apply_ep_summed(layer: nn.Module, mesh: Any) -> nn.Module:
    """Experts over ep, every gradient the sum over the data-parallel ranks."""
    return composed(layer, mesh, experts_divisor=lambda s: 1, dense_divisor=lambda s: 1)
