"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: the embedding. The vocabulary-sharded embedding hands
on its output without the all-reduce, each rank's rows of the vocabulary only (a partial sum).

Guard: tp.forward_equals_unsharded.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import RowwiseParallel

from nemo_dist.distributed import tensor_parallel as bundled


class _PartialEmbedding(RowwiseParallel):
    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: Any) -> Any:
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled entry point with a partial embedding (without sequence parallelism)."""
    plan = tp_shard_plan or bundled.get_parallel_plan(model, sequence_parallel)
    if not sequence_parallel:
        plan = {**plan, "model.embed_tokens": _PartialEmbedding(input_layouts=Replicate())}
    return bundled.parallelize_tp(model, tp_mesh, sequence_parallel=sequence_parallel, tp_shard_plan=plan)
