"""Broken fork of ``nemo_dist.distributed.tensor_parallel``: SP norms. Under sequence parallelism the norms get no
style (their weights plain tensors), and each row-wise layer's output is handed on as a local sequence shard.

Guard: tp.gradients_equal_unsharded (under sequence parallelism).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from nemo_dist.distributed import tensor_parallel as bundled


def parallelize_tp(
    model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False, tp_shard_plan: Any = None
) -> nn.Module:
    """The bundled entry point; its sequence-parallel plan without the norms' styles."""
    plan = tp_shard_plan
    if plan is None and sequence_parallel:
        plan = {
            key: style for key, style in bundled.llama_plan(False).items() if key != "model.embed_tokens"
        }
        plan.update({
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.layers.*.self_attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "model.layers.*.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        })
        assert not any(isinstance(style, SequenceParallel) for style in plan.values())
    return bundled.parallelize_tp(model, tp_mesh, sequence_parallel=sequence_parallel, tp_shard_plan=plan)
