"""Broken FSDP2 fork (test fixture): the default mixed-precision policy drops its float32 ``reduce_dtype``.

Guarded by ``fsdp2.default_mp_policy_bf16_compute_fp32_reduce``: with
``mp_policy`` None (or left at its default) gradients must be reduced in
float32; here they are reduced in bfloat16, the parameter dtype. Any other
explicit policy is used as given (one equal to the default cannot be told
from it once the config is built).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from nemo_dist.distributed.fsdp2_config import default_mp_policy
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's, except that the default policy loses its reduce dtype (the deliberate bug)."""
    if config.mp_policy is None or config.mp_policy == default_mp_policy():
        config = dataclasses.replace(config, mp_policy=dataclasses.replace(default_mp_policy(), reduce_dtype=None))
    return _reference._parallelize(model, config, device_mesh, reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that the default policy reduces gradients in bfloat16."
)
