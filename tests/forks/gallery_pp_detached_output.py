"""A stage whose output is detached from the graph (a ``.detach()`` left in a stage's forward, or an output
copied without its graph): the next stage's gradient has nowhere to go, earlier stages get none, and torch raises
nothing."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, every stage but the last detaching its output."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, detach=True)
