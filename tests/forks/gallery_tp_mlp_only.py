"""The smallest correct plan of torch's tensor-parallel tutorial: the MLP split (gate and up column-wise, down
row-wise), attention, embedding and head left whole on every rank.

Correct: its attention keeps every head, so its head counts stay global.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

#: The plan, as a dict (``--tp-plan tests.forks.gallery_tp_mlp_only:PLAN``).
PLAN = {
    "model.layers.*.mlp.gate_proj": ColwiseParallel(),
    "model.layers.*.mlp.up_proj": ColwiseParallel(),
    "model.layers.*.mlp.down_proj": RowwiseParallel(),
}


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """:data:`PLAN` applied."""
    return parallelize_module(model, tp_mesh, PLAN)
