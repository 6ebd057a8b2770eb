"""Independent gather fork (test fixture): written from the contract (docs/contract.md), sharing no nemo_dist code.

Upstream style: list ``all_gather`` + ``cat`` forward, ``stack`` + ``all_reduce`` +
slice backward. ``uneven=True`` learns every rank's shape and dtype with
``all_gather_object``, pads to the longest rank and trims. ``group=`` uses
group ranks and sizes. It must pass every gather check: the suite does not
merely recognise the reference's own code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


def _validate(x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("a 0-d tensor has no dim 0 to gather on; reshape it to (1,)")


def _rank_and_size(group: Any) -> tuple[int, int] | None:
    """(rank, size) in ``group``; None when there is no one to gather with."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    rank = dist.get_rank(group=group)
    if rank < 0:
        raise ValueError("this rank is not a member of the group it gathers over")
    size = dist.get_world_size(group=group)
    return None if size == 1 else (rank, size)


def _rows_of_every_rank(x: torch.Tensor, group: Any, size: int) -> list[int]:
    """Row counts in rank order; ValueError on every rank if trailing dims or dtypes differ."""
    described: list[Any] = [None] * size
    dist.all_gather_object(described, (tuple(x.shape), str(x.dtype)), group=group)
    if len({shape[1:] for shape, _ in described}) != 1 or len({dtype for _, dtype in described}) != 1:
        table = "; ".join(f"rank {r} has shape {list(s)} and {d}" for r, (s, d) in enumerate(described))
        raise ValueError(f"uneven gather needs equal trailing dims and dtype on all ranks: {table}")
    return [shape[0] for shape, _ in described]


def _gather_parts(x: torch.Tensor, group: Any, size: int, rows: Sequence[int]) -> list[torch.Tensor]:
    longest = max(rows)
    send = x.contiguous()
    if send.shape[0] < longest:
        send = torch.cat([send, send.new_zeros((longest - send.shape[0], *send.shape[1:]))])
    parts = [torch.empty_like(send) for _ in range(size)]
    dist.all_gather(parts, send, group=group)
    return [part[:n] for part, n in zip(parts, rows, strict=True)]


def _sum_my_rows(grad: torch.Tensor, group: Any, rank: int, rows: Sequence[int]) -> torch.Tensor:
    stacked = grad.new_zeros((len(rows), max(rows), *grad.shape[1:]))
    start = 0
    for r, n in enumerate(rows):
        stacked[r, :n] = grad[start : start + n]
        start += n
    dist.all_reduce(stacked, group=group)
    return stacked[rank, : rows[rank]]


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, rank: int, rows: list[int]) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.rows = group, rank, rows
        return torch.cat(_gather_parts(x, group, len(rows), rows))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _sum_my_rows(grad, ctx.group, ctx.rank, ctx.rows), None, None, None


class _AllGatherWithGrad(torch.autograd.Function):
    """forward(ctx, x) -> one tensor per rank; backward sums every rank's gradient of my slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _validate(x)
        ctx.where = _rank_and_size(None)
        if ctx.where is None:
            return (x.clone(),)
        return tuple(_gather_parts(x, None, ctx.where[1], [x.shape[0]] * ctx.where[1]))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        if ctx.where is None:
            return grads[0]
        rank, size = ctx.where
        return _sum_my_rows(torch.cat(grads), None, rank, [grads[0].shape[0]] * size)


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """cat of every rank's ``x`` on dim 0, differentiable; ``x`` itself when there is no one to gather with."""
    _validate(x)
    where = _rank_and_size(group)
    if where is None:
        return x
    rank, size = where
    rows = _rows_of_every_rank(x, group, size) if uneven else [x.shape[0]] * size
    return _Gather.apply(x, group, rank, rows)


def all_gather_no_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The same cat, outside autograd; ``x.detach()`` when there is no one to gather with."""
    _validate(x)
    where = _rank_and_size(group)
    if where is None:
        return x.detach()
    size = where[1]
    with torch.no_grad():
        rows = _rows_of_every_rank(x, group, size) if uneven else [x.shape[0]] * size
        return torch.cat(_gather_parts(x.detach(), group, size, rows))
