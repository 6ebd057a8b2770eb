"""Gallery wrapper, broken: HSDP whose replicas are never averaged (sharded over the shard dimension only).

Bug, as written when porting FSDP to a 2-D mesh: the model is sharded over
``mesh["dp_shard"]``, the 1-D sub-mesh of this rank's replica group, instead
of the whole 2-D mesh. FSDP then reduces gradients within the replica group
alone; the groups never exchange theirs, so the replicas train on their own
share of the batch and diverge.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_hsdp"]


def apply_hsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """BUG: shard over the ``dp_shard`` sub-mesh alone; the ``dp_replicate`` dimension is dropped."""
    shard_blocks_then_root(model, mesh["dp_shard"])
    return model
