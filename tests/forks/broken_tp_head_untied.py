"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: the head and tied weights. After
``parallelize_module`` the head keeps the DTensor it was given, no longer the embedding's weight.

Guard: tp.tied_embeddings_stay_tied.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from nemo_dist.distributed import tensor_parallel as bundled


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled steps but the re-tie."""
    bundled.validate_tp_mesh(model, tp_mesh)
    parallelize_module(model, tp_mesh, bundled.get_parallel_plan(model, sequence_parallel, tp_shard_plan))
    bundled._set_local_head_counts(model, tp_mesh.size())
    return model
