"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: the plan chooser's order. An explicit
``tp_shard_plan`` is taken last, after the optimized and default plans, so it is never used.

Guard: tp.explicit_plan_comes_first.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from nemo_dist.distributed import tensor_parallel as bundled


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled entry point, its explicit plan dropped for the chosen one."""
    return bundled.parallelize_tp(model, tp_mesh, sequence_parallel=sequence_parallel)
