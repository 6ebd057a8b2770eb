"""A split of ``layers // stages`` layers a stage (mlx-lm #1688's class): with a layer count the stages do not
divide, the remainder is held by no stage and never run."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split cut short."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, floor_split=True)
