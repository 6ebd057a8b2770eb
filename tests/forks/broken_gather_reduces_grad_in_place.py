"""Broken fork (test fixture): backward all-reduces the caller's gradient in place.

The gradient of ``x`` is right (the sum over ranks of their gradients, this
rank's rows kept), but the all-reduce runs on the upstream gradient itself
when it is contiguous (``.contiguous()`` copies only when it is not), so the
tensor the caller passed to ``out.backward(g)`` now holds the sum over ranks.
Uneven gathers keep the reference's backward. Everything else is the reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.loss.dist_utils import (
    _AllGatherWithGrad,
    _GatherRows,
    _plan,
    _scatter_grad,
    all_gather_no_grad,
)

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


class _ReducingInPlace(_GatherRows):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.rows is not None:
            return _scatter_grad(grad, ctx.group, ctx.rank, ctx.size, ctx.rows), None, None, None, None
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # BUG: in place, into the caller's tensor when it was contiguous
        n = grad.shape[0] // ctx.size
        return grad[ctx.rank * n : (ctx.rank + 1) * n].clone(), None, None, None, None


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the backward reducing in place."""
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    rank, size, rows = plan
    return _ReducingInPlace.apply(x, group, rank, size, rows)
