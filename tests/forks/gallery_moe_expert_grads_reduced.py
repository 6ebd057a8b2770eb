"""Expert gradients all-reduced over the expert-parallel ranks after backward, as a data-parallel reduction
would be if the expert-parallel ranks were also counted as data-parallel replicas of the experts (the class of
pytorch issue 160285: expert-parallel gradients summed over ranks that hold different experts).

Broken: moe.gradients_equal_one_process fails on the experts (and so moe.trains_like_one_process).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, and a hook summing each expert weight's local gradient over the mesh."""
    dispatched(layer, ep_mesh)
    group = ep_mesh.get_group()
    for param in (layer.experts.w1, layer.experts.w2):
        def reduce(p: torch.Tensor) -> None:
            dist.all_reduce(p.grad.to_local(), group=group)

        param.register_post_accumulate_grad_hook(reduce)
    return layer
