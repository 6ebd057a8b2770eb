"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: a custom style's layouts. The sequence-parallel norm
before attention and the MLP (``SequenceParallelGathered``) hands on its sequence shard instead of gathering it,
so attention and the MLP see one rank's tokens.

Guard: tp.forward_equals_unsharded (under sequence parallelism).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import SequenceParallel

from nemo_dist.distributed import tensor_parallel as bundled


class _KeepsShard(SequenceParallel):
    """SequenceParallel whose output stays the local shard."""

    @staticmethod
    def _prepare_output_fn(use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: Any) -> Any:
        return outputs.to_local()


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled entry point with the gathering norms replaced."""
    plan = tp_shard_plan or {
        key: (_KeepsShard() if isinstance(style, bundled.SequenceParallelGathered) else style)
        for key, style in bundled.get_parallel_plan(model, sequence_parallel).items()
    }
    return bundled.parallelize_tp(model, tp_mesh, sequence_parallel=sequence_parallel, tp_shard_plan=plan)
