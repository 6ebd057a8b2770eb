"""The router made a ``Replicate`` DTensor over the expert-parallel mesh and used through ``to_local()``: its
gradient is each rank's own share but marked ``Replicate``, so no reduction ever sums it and the replicas step
apart (the class of torchtitan issue 2387 / PR 2416: a Partial gradient marked Replicate).

Broken: moe.gradients_equal_one_process fails on the router, moe.trains_like_one_process with the routers apart.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, distribute_tensor

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, the router's weights replicated DTensors read locally."""
    dispatched(layer, ep_mesh)
    router = layer.router
    for name in ("weight", "bias"):
        setattr(router, name, nn.Parameter(distribute_tensor(getattr(router, name).detach(), ep_mesh, [Replicate()])))

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to_local(), self.bias.to_local())

    router.forward = types.MethodType(forward, router)
    return layer
