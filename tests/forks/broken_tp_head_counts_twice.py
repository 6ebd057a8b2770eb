"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: head counts. Each attention's head counts are divided
by the tensor-parallel size twice (a plan applied per layer that updates the counts of every layer each time).

Guard: tp.forward_equals_unsharded (the attention's shapes fail on every rank) and
tp.attention_head_counts_are_local.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from nemo_dist.distributed import tensor_parallel as bundled


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled entry point, then the head counts divided once more."""
    bundled.parallelize_tp(model, tp_mesh, sequence_parallel=sequence_parallel, tp_shard_plan=tp_shard_plan)
    bundled._set_local_head_counts(model, tp_mesh.size())
    return model
