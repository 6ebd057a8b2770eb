"""Broken FSDP2 fork (test fixture): the root module is sharded with ``reshard_after_forward=True``.

Guarded by ``fsdp2.reshard_after_forward_chooses_units``: the root unit must
keep its parameters unsharded between forward and backward; here they are
sharded DTensors again right after forward (and all-gathered once more in
backward).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's, except that the root reshards after forward (the deliberate bug)."""
    _reference._parallelize(model, config, device_mesh, reapply_trainability)
    if isinstance(model, FSDPModule):
        # As fully_shard(model, reshard_after_forward=True) would have set it: the root only, not its units.
        model.set_reshard_after_forward(True, recurse=False)
    return model


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that the root module reshards its parameters after forward."
)
