"""Two stages a rank always placed round robin (rank r holds stages r and r + pp), whatever the schedule: right for
Interleaved1F1B, wrong for ZBVZeroBubble and DualPipeV, which run them in a V (rank r runs stages r and
2 * pp - 1 - r). Handed to a V schedule the ranks exchange with the wrong peers: on gloo a rank aborts trying to
allocate terabytes from garbage shape metadata. ZBVZeroBubble by default."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from nemo_dist.distributed.pipeline_parallel import schedule_class, split_layers, stage_indices, stage_module
from tests.forks._pipelines import Loss


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, *,
             schedule: str = "ZBVZeroBubble") -> Any:
    """Two stages a rank, round robin, under the schedule named."""
    rank, size = pp_mesh.get_local_rank(), pp_mesh.size()
    total = 2 * size
    splits = split_layers(len(model.layers), total)
    stages = [PipelineStage(stage_module(model, splits[i], first=i == 0, last=i == total - 1), i, total,
                            torch.device("cpu"), group=pp_mesh.get_group())
              for i in stage_indices(rank, size, 2, "loop")]
    return schedule_class(schedule)(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False), stages
