"""Gallery wrapper, broken: FSDP2 whose gradients are divided by the world size twice.

Bug, as written to "pre-scale" for averaging: the gradient divide factor is
set to W * W (a 1/W the author adds, on top of the 1/W FSDP's mean already
takes), so each rank gets the mean divided by W.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """BUG: the divide factor is W * W, not W."""
    sharded = shard_blocks_then_root(model, mesh)
    sharded.set_gradient_divide_factor(float(mesh.size() ** 2))
    return model
