"""Gallery wrapper, broken: torchtitan-style summing FSDP2 whose divide factor is set on the root alone.

Bug, as written from the belief that FSDP settings flow down like
``set_requires_gradient_sync``: the blocks then the root are sharded and
``set_gradient_divide_factor(1.0)`` is called on the root only. The factor
is a setting of each FSDP module's own parameter group and does not
recurse: the root's own parameters are summed over the ranks, every
block's are still averaged. A model that is one FSDP module (a bare
``nn.Linear``) trains right; a nested one does not.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, meant to sum; BUG: only the root's parameters are summed."""
    sharded = shard_blocks_then_root(model, mesh)
    sharded.set_gradient_divide_factor(1.0)  # BUG: the root's group only; the blocks keep the mean
    return model
