"""The final norm applied twice on the last stage (a stage's forward that normalizes its output, put before a
head module that normalizes again): with norm weights away from 1 the logits change, and nothing raises."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, the last stage's norm applied twice."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, norm_twice=True)
