"""The smallest correct plan of torch's tensor-parallel tutorial: the MLP split (gate and up column-wise, down
row-wise), attention, embedding and head left whole on every rank.

Correct: its attention keeps every head, so its head counts stay global.
"""

from __future__ import annotations

from typing import Any

import torch
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


class FeatureMLP(nn.Module):
    """A model that starts with a Linear (features in), for ``--tp-model``: the suite feeds it float64 features."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def feature_mlp() -> nn.Module:
    """A :class:`FeatureMLP` (its factory)."""
    return FeatureMLP()


#: The Megatron split of :class:`FeatureMLP` as a plan dict.
FEATURE_PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


def scaled_features(batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """A ``--tp-input`` factory: features ten times larger than the default ones."""
    return 10 * torch.randn(batch, seq, 8, generator=generator, dtype=torch.float64)
