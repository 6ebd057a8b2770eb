"""Broken FSDP2 fork (test fixture): activation checkpointing covers every layer group, whatever the scope says.

Guarded by ``fsdp2.activation_checkpointing_recomputes_selected_layers``:
only the blocks of the groups the scope names may be recomputed (scope
``"vision"``: no language block); here the blocks of every group are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's, with the checkpointing scope widened to "all" (the deliberate bug)."""
    config = dataclasses.replace(config, activation_checkpointing_scope="all")
    return _reference._parallelize(model, config, device_mesh, reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that activation checkpointing ignores its scope."
)
