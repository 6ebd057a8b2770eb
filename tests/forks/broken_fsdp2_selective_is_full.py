"""Broken FSDP2 fork (test fixture): ``activation_checkpointing="selective"`` checkpoints fully.

Guarded by ``fsdp2.activation_checkpointing_recomputes_selected_layers``: a
selected layer under selective must recompute strictly fewer ops than full
checkpointing. Here selective is mapped to full: the layers' attention and
MLP run again and the gradients are unchanged, which is all the check asked
before.
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
    """The reference's, with selective checkpointing made full (the deliberate bug)."""
    if config.activation_checkpointing == "selective":
        config = dataclasses.replace(config, activation_checkpointing="full")
    return _reference._parallelize(model, config, device_mesh, reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that selective checkpointing is full."
)
