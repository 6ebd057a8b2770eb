"""Gallery wrapper, broken: FSDP2 that never reshards, so each forward after the first reuses stale parameters.

Bug, as written to skip every all-gather after the first: ``fully_shard``
with ``reshard_after_forward=False`` on each block and the root, then
``set_reshard_after_backward(False)`` on every FSDP module (the setting
FSDP's documentation offers for gradient accumulation, left on for good).
The unsharded parameters are then never freed: they stay registered on the
modules after backward, and the next forward finds them unsharded and
all-gathers nothing. The optimizer (built on the sharded parameters, as
usual) updates the shards, which no forward reads again: every step's
gradient is taken at the first step's weights. (A step taken on what
``model.parameters()`` holds after backward finds the unsharded parameters,
whose gradients FSDP has already reduced into the shards and cleared: it
updates nothing.)
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, averaged; BUG: the parameters are never resharded."""
    shard_blocks_then_root(model, mesh, reshard_after_forward=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_backward(False)  # BUG: with the above, never resharded: stale after a step
    return model
