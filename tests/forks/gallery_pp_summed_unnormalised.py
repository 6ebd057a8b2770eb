"""A loss summed over the label tokens and never divided by them (torchtitan #2972, #4194): the pipeline's own
``cross_entropy(..., reduction="sum")`` with ``scale_grads=False`` and no division after the step. Every gradient
is the batch's label-token count times one process's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.forks._pipelines import Loss, manual


def _summed(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), reduction="sum")


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split with its own summed loss, scale_grads=False."""
    return manual(model, pp_mesh, n_microbatches, _summed, scale_grads=False)
