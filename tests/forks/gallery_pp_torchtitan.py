"""torchtitan's manual pipeline split (``pipeline_module_split``): a deep copy of the model per stage, the layers
it does not hold deleted, ``ceil(layers / stages)`` layers a stage, torch's default ``scale_grads=True`` on a mean
loss; composed with data parallelism (``dp_mesh``), each stage sharded with FSDP2 as torchtitan's ``apply_fsdp``
shards one (each block, the embedding, the final norm and head together, then the stage). Correct."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, schedule: str = "1F1B",
             dp_mesh: Any = None) -> Any:
    """One stage per rank, torchtitan's split, the schedule named (1F1B by default), sharded over ``dp_mesh``."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, schedule=schedule, dp_mesh=dp_mesh)
