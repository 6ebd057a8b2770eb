"""Expert parallelism that sends the tokens to the experts' ranks outside autograd (a plain all-to-all on
``tokens.detach()``, as a dispatcher written for inference does) and brings the results back with an autograd
one: the experts and the router learn rightly, but no gradient of the experts' part reaches the layers before.

Broken: moe.gradients_equal_one_process fails on the tokens' gradient alone, naming the detached dispatch.
``--moe-fn tests.forks.gallery_moe_dispatch_detached:apply_ep``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, the tokens sent detached."""
    return dispatched(layer, ep_mesh, detach_tokens=True)
