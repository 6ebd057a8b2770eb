"""Expert parallelism whose expert gradients are divided by the expert-parallel size after backward, to "average"
them as data-parallel gradients are, though no other rank holds the same experts (the class of Megatron-LM #5656
and DeepSpeed #5618: expert gradients averaged over a group that holds no replica of them).

Broken: moe.gradients_equal_one_process and moe.trains_like_one_process fail, naming the exact factor 1/W.
``--moe-fn tests.forks.gallery_moe_expert_grads_averaged:apply_ep``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, and a hook dividing each expert weight's local gradient by the mesh size."""
    dispatched(layer, ep_mesh)
    size = ep_mesh.size()

    def averaged(param: torch.Tensor) -> None:
        with torch.no_grad():
            param.grad.to_local().div_(size)  # type: ignore[union-attr]

    for param in (layer.experts.w1, layer.experts.w2):
        param.register_post_accumulate_grad_hook(averaged)
    return layer
