"""The loss averaged over the microbatches twice: the loss divided by the microbatch count by hand (as a
gradient-accumulation loop does) inside a schedule that divides by it too (``scale_grads=True``). Gradients and
the reported loss are 1/M of one process's."""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, the loss over n_microbatches, scale_grads=True."""

    def divided(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) / n_microbatches

    return manual(model, pp_mesh, n_microbatches, divided)
