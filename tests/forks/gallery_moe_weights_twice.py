"""Expert parallelism that weights each expert's output by its routing weight on the expert's rank (the
"unpermute with probabilities" step some dispatchers have) and again in the combine: every output is weighted by the
square of its routing weight.

Broken: every moe check but the sharding one fails, naming the weights applied twice.
``--moe-fn tests.forks.gallery_moe_weights_twice:apply_ep``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, the routing weights applied twice."""
    return dispatched(layer, ep_mesh, weights_twice=True)
