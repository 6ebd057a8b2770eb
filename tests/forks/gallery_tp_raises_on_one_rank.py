"""A plan that breaks on one rank only: rank 1 of the tensor-parallel group raises while parallelizing, rank 0
applies torch's tutorial MLP split and goes on into a forward whose all-reduce waits for rank 1.

Not a pattern from the wild: the harness's case of a target that raises on some ranks. The verdict must show rank
1's exception (and where rank 0 was stuck), never a HANG.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks.gallery_tp_mlp_only import plan as mlp_only


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The tutorial's MLP split on every rank but rank 1, which raises."""
    if tp_mesh.get_local_rank() == 1:
        raise RuntimeError("this plan breaks on rank 1")
    return mlp_only(model, tp_mesh)
