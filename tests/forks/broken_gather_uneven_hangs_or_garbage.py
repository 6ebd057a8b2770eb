"""Broken fork (test fixture): ``uneven=True`` does not validate trailing dims.

It exchanges only row and element counts (and checks dtypes), gathers flat
buffers and reshapes every rank's elements with the LOCAL trailing dims: with
differing trailing dims some ranks get garbage rows, others a reshape error,
instead of a ValueError on every rank. Valid inputs gather correctly.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.loss.dist_utils import (
    _all_gather_single,
    _AllGatherWithGrad,
    _check_not_0d,
    _check_tensor,
    _dtype_code,
    _GatherRows,
    _scatter_grad,
    _world,
)
from nemo_dist.loss.dist_utils import all_gather_no_grad as _reference_no_grad

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


def _exchange_counts(x: torch.Tensor, group: Any, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    meta = torch.tensor([x.shape[0], x.numel(), _dtype_code(x.dtype)], dtype=torch.int64, device=x.device)
    gathered = torch.empty(size * 3, dtype=torch.int64, device=x.device)
    _all_gather_single(gathered, meta, group=group)
    table = gathered.view(size, 3).tolist()
    if len({code for _, _, code in table}) > 1:
        raise ValueError(f"uneven=True: dtypes differ between ranks (rank {x.dtype} here)")
    # BUG: trailing dims are never compared
    return tuple(rows for rows, _, _ in table), tuple(numel for _, numel, _ in table)


def _flat_gather(x: torch.Tensor, group: Any, size: int, numels: tuple[int, ...]) -> torch.Tensor:
    most = max(numels)
    padded = x.new_zeros(most)
    padded[: x.numel()] = x.reshape(-1)
    buffer = torch.empty(size * most, dtype=x.dtype, device=x.device)
    _all_gather_single(buffer, padded, group=group)
    return torch.cat([buffer[r * most : r * most + n].view(-1, *x.shape[1:]) for r, n in enumerate(numels)])


class _FlatRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, rank: int, size: int, rows: Any, numels: Any) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.size, ctx.rows = group, rank, size, rows
        return _flat_gather(x, group, size, numels)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _scatter_grad(grad, ctx.group, ctx.rank, ctx.size, ctx.rows), None, None, None, None, None


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the unvalidated uneven path."""
    _check_tensor(x, "all_gather_with_grad")
    if not uneven:
        _check_not_0d(x, "all_gather_with_grad")
    world = _world(group)
    if world is None:
        return x
    rank, size = world
    if not uneven:
        return _GatherRows.apply(x, group, rank, size, None)
    rows, numels = _exchange_counts(x, group, size)
    return _FlatRows.apply(x, group, rank, size, rows, numels)


def all_gather_no_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference, with the unvalidated uneven path."""
    _check_tensor(x, "all_gather_no_grad")
    world = _world(group)
    if world is None or not uneven:
        return _reference_no_grad(x, group=group)
    _, numels = _exchange_counts(x, group, world[1])
    with torch.no_grad():
        return _flat_gather(x.detach(), group, world[1], numels)
