"""A pipeline that breaks on one rank only: rank 1 raises while building, rank 0 builds its stage and goes on into
the schedule's step, whose send waits for rank 1.

Not a pattern from the wild: the harness's case of a target that raises on some ranks. The verdict must show rank
1's exception, never a HANG.
"""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split under GPipe (any microbatch count) on every rank but rank 1, which raises."""
    if pp_mesh.get_local_rank() == 1:
        raise RuntimeError("this pipeline breaks on rank 1")
    return manual(model, pp_mesh, n_microbatches, loss_fn, schedule="GPipe")
