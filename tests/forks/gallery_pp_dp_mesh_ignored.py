"""A pipeline function that takes ``dp_mesh`` and never uses it: its stages are neither sharded nor replicated
over the dp ranks, so each dp rank trains on its own rows alone and its gradients are never reduced (the
pipeline runs, and torch raises nothing)."""

from __future__ import annotations

from typing import Any

from nemo_dist.distributed.pipeline_parallel import build_pipeline
from tests.forks._pipelines import Loss


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, *, schedule: str = "1F1B",
             dp_mesh: Any = None) -> Any:
    """The bundled pipeline, ``dp_mesh`` dropped."""
    return build_pipeline(model, pp_mesh, n_microbatches, loss_fn, schedule=schedule)
