"""A pipeline function that takes ``dp_mesh`` and refuses it on every rank before any communication (its author
supports pipeline parallelism alone): the data-parallel check is not applicable, showing the refusal."""

from __future__ import annotations

from typing import Any

from nemo_dist.distributed.pipeline_parallel import build_pipeline
from tests.forks._pipelines import Loss


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, *, schedule: str = "1F1B",
             dp_mesh: Any = None) -> Any:
    """The bundled pipeline; ``NotImplementedError`` where a ``dp_mesh`` is given."""
    if dp_mesh is not None:
        raise NotImplementedError("this pipeline does not compose with data parallelism")
    return build_pipeline(model, pp_mesh, n_microbatches, loss_fn, schedule=schedule)
