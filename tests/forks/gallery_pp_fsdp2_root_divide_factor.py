"""The bundled pipeline composed with FSDP2, with FSDP2's gradient divide factor set on each stage's root only (to
1, a sum over the dp ranks): ``set_gradient_divide_factor`` sets only the unit it is called on, so every layer's
unit still averages over dp while the root's own parameters (the embedding, the final norm, the head) are summed.
Under upstream's loop (the label tokens over the dp size, after FSDP2's average) those come out dp times too
large; the layers' are right."""

from __future__ import annotations

from typing import Any

from nemo_dist.distributed.pipeline_parallel import build_pipeline
from tests.forks._pipelines import Loss


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, *, schedule: str = "1F1B",
             dp_mesh: Any = None) -> Any:
    """The bundled pipeline; with ``dp_mesh``, each stage's root unit reducing with a divide factor of 1."""
    made, stages = build_pipeline(model, pp_mesh, n_microbatches, loss_fn, schedule=schedule, dp_mesh=dp_mesh)
    if dp_mesh is not None:
        for stage in stages:
            stage.submod.set_gradient_divide_factor(1.0)
    return made, stages
