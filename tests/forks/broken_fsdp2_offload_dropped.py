"""Broken FSDP2 fork (test fixture): ``offload_policy`` is ignored; every unit gets the plain ``OffloadPolicy()``.

Guarded by ``fsdp2.cpu_offload_trains_and_offloads``: with ``CPUOffloadPolicy``
configured, every FSDP unit must offload its parameters, gradients and
optimizer state to the CPU; here no unit does.
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
    """The reference's, with the offload policy dropped (the deliberate bug)."""
    config = dataclasses.replace(config, offload_policy=None)
    return _reference._parallelize(model, config, device_mesh, reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that the offload policy is dropped (no CPU offload)."
)
