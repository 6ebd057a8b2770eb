"""A split whose stages overlap at their boundaries (an inclusive end index, ``layers[start:end + 1]``): the layer
at each boundary is held, and run, by two stages."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, every stage after the first also holding the layer before its own."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, overlap=True)
