"""A ``SequenceParallel`` norm fed an input that is already whole (pytorch 129355): the style takes the plain
tensor for this rank's shard of the sequence, so the sequence is tiled tensor-parallel-size times.

Broken: tp.forward_equals_unsharded fails.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from tests.forks._tensor_parallel import megatron


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split of the layers (whole activations between them), the final norm sequence-parallel."""
    megatron(model, tp_mesh)
    parallelize_module(model, tp_mesh, {"model.norm": SequenceParallel(use_local_output=True)})
    return model
