"""Broken fork (test fixture): backward returns this rank's slice of its OWN upstream gradient.

The sum over ranks is missing, so the gradient is right only when every rank's
upstream gradient agrees. Everything else is the reference.
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


class _OwnSliceRows(_GatherRows):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows = ctx.rows or (grad.shape[0] // ctx.size,) * ctx.size
        start = sum(rows[: ctx.rank])
        return grad[start : start + rows[ctx.rank]].clone(), None, None, None, None  # BUG: no sum over ranks


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the broken backward."""
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    rank, size, rows = plan
    return _OwnSliceRows.apply(x, group, rank, size, rows)
