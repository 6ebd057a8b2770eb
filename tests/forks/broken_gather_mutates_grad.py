"""Broken fork (test fixture): backward zeroes the incoming gradient buffer after using it.

A "free the memory early" bug: the gradient of ``x`` is right, but the tensor
the caller passed to ``out.backward(g)`` is zeroed. Everything else is the reference.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.loss.dist_utils import (
    _AllGatherWithGrad,
    _GatherRows,
    _plan,
    _scatter_grad,
    all_gather_no_grad,
)

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


class _ZeroingRows(_GatherRows):
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out = _scatter_grad(grad, ctx.group, ctx.rank, ctx.size, ctx.rows)
        grad.zero_()  # BUG: modifies the caller's gradient in place
        return out, None, None, None, None


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the mutating backward."""
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    rank, size, rows = plan
    return _ZeroingRows.apply(x, group, rank, size, rows)
