"""A mean loss per microbatch summed over the microbatches, never averaged: the schedule built with
``scale_grads=False`` (upstream's setting, which expects a token-summed loss) fed a microbatch's mean. The loss the
last stage reports (the mean of the microbatch losses) looks right; every gradient is M times too large."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, scale_grads=False."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, scale_grads=False)
