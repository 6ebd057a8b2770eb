"""torch's own tracer: ``pipeline()`` traces the model on an example microbatch (the suite's: 2 rows of 6 token ids)
and splits it at ``SplitPoint.BEGINNING`` of a layer, ``build_stage`` makes this rank's stage; torch's default
``scale_grads=True`` on a mean loss. The traced stages keep the model's parameter names. Correct."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, SplitPoint, build_stage
from torch.distributed.pipelining import pipeline as trace

from tests.forks._pipelines import Loss

#: The example microbatch the tracer runs: the suite feeds microbatches of 2 rows of 6 token ids.
ROWS, SEQ = 2, 6


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, schedule: str = "GPipe") -> Any:
    """One traced stage per rank, split before layer ``layers * r // pp`` of rank r > 0."""
    size, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    split_spec = {f"layers.{len(model.layers) * r // size}": SplitPoint.BEGINNING for r in range(1, size)}
    example = torch.zeros(ROWS, SEQ, dtype=torch.long)
    pipe = trace(model, mb_args=(example,), split_spec=split_spec)
    stage = build_stage(pipe.get_stage_module(rank), rank, pipe.info(), torch.device("cpu"), group=pp_mesh.get_group())
    cls = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
    return cls(stage, n_microbatches, loss_fn=loss_fn), [stage]
