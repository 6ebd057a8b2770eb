"""Broken FSDP2 fork (test fixture): the mixed-precision policy is rebuilt without its ``cast_forward_inputs``.

Guarded by ``fsdp2.every_unit_holds_the_configured_policy``: each unit must
hold the config's policy, all four fields. Here the policy handed to
``fully_shard`` is built from three of them, so torch's default
(``cast_forward_inputs=True``) replaces upstream's False, the default policy
included, and a layer's float32 side input arrives in bfloat16. The other
dtype checks see nothing: the residual stream is bfloat16 either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's, with the policy rebuilt from param, reduce and output dtypes only (the deliberate bug)."""
    held = config.mp_policy
    rebuilt = MixedPrecisionPolicy(
        param_dtype=held.param_dtype, reduce_dtype=held.reduce_dtype, output_dtype=held.output_dtype
    )
    return _reference._parallelize(model, dataclasses.replace(config, mp_policy=rebuilt), device_mesh,
                                   reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that its policy loses cast_forward_inputs."
)
