"""Broken fork (test fixture): forward returns the ranks' rows rotated by one rank.

Rank r's rows come first where rank 0's belong. Everything else is the reference.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.loss.dist_utils import (
    _AllGatherWithGrad,
    _GatherRows,
    _plan,
    all_gather_no_grad,
)

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


class _RotatedRows(_GatherRows):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, rank: int, size: int, rows: Any) -> torch.Tensor:
        out = _GatherRows.forward(ctx, x, group, rank, size, rows)
        return torch.roll(out, shifts=x.shape[0], dims=0)  # BUG: rank order rotated


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the rotated forward."""
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    rank, size, rows = plan
    return _RotatedRows.apply(x, group, rank, size, rows)
