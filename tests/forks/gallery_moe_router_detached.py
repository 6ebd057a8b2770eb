"""Routing weights applied detached: the combine multiplies the experts' outputs by ``weights.detach()`` (the
class of NeMo AutoModel PR 2995, routing probabilities moved with a plain collective): the output is right, the
router learns only from the auxiliary loss.

Broken: moe.gradients_equal_one_process fails on the router alone (and so moe.trains_like_one_process).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch with the routing weights detached."""
    return dispatched(layer, ep_mesh, detach_weights=True)
