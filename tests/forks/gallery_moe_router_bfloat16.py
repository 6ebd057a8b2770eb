"""Expert parallelism whose router runs in bfloat16 to save memory (the logits cast back to the layer's dtype):
the routing weights carry bfloat16's rounding.

Broken (against a float64 layer): the checks fail with every difference within bfloat16's rounding, named as such.
``--moe-fn tests.forks.gallery_moe_router_bfloat16:apply_ep``.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, the router computed in bfloat16."""
    dispatched(layer, ep_mesh)

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        low = torch.bfloat16
        return F.linear(x.to(low), self.weight.to(low), self.bias.to(low)).to(x.dtype)

    layer.router.forward = types.MethodType(forward, layer.router)
    return layer
