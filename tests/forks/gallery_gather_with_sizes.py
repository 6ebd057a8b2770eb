"""Gallery fork: ``gather_with_sizes(x, *, dim)`` returning ``(gathered, sizes)``. Correct.

Pattern (sequence parallelism, variable-length batches): a function with a
required keyword ``dim`` that all-gathers ranks' tensors of different sizes
along ``dim`` (each rank's size gathered first, every tensor padded to the
largest, the padding cut off again) and returns the concatenation on ``dim``
together with the list of every rank's size on ``dim``. Autograd goes through
a custom autograd Function whose backward all-reduces (SUM) a copy of the
upstream gradient and takes this rank's rows, which is what a reduce-scatter
gives. It is checked with ``--gather-kwarg dim=0 --gather-output 0``.

``timed_gather_with_sizes`` is the same behind a timing decorator written
without ``functools.wraps``: its signature hides ``dim`` (``*args, **kwargs``).
``AllGatherOnDim`` is the equal-size variant as a bare autograd Function,
called ``AllGatherOnDim.apply(x, dim)``: ``apply`` passes positional
arguments only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllGatherOnDim", "gather_with_sizes", "timed_gather_with_sizes"]


def _sizes(x: torch.Tensor, dim: int) -> list[int]:
    """Every rank's size of ``x`` on ``dim``."""
    mine = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(s.item()) for s in every]


class _GatherWithSizes(torch.autograd.Function):
    """Concatenate every rank's ``x`` on ``dim``; backward sums every rank's gradient and keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.dim, ctx.sizes = dim, sizes
        largest = max(sizes)
        pad = list(x.shape)
        pad[dim] = largest - x.shape[dim]
        padded = torch.cat([x, x.new_zeros(pad)], dim=dim).contiguous()
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded)
        return torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes, strict=True)], dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        rank = dist.get_rank()
        start = sum(ctx.sizes[:rank])
        return summed.narrow(ctx.dim, start, ctx.sizes[rank]), None, None


def gather_with_sizes(x: torch.Tensor, *, dim: int) -> tuple[torch.Tensor, list[int]]:
    """Every rank's ``x`` concatenated on ``dim`` (sizes may differ there), and every rank's size on ``dim``."""
    sizes = _sizes(x, dim)
    return _GatherWithSizes.apply(x, dim, sizes), sizes


class AllGatherOnDim(torch.autograd.Function):
    """Every rank's ``x`` (all of one shape) concatenated on ``dim``; backward sums and keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any = None) -> torch.Tensor:
        ctx.dim, ctx.group, ctx.rows = dim, group, x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=ctx.group)
        start = dist.get_rank(ctx.group) * ctx.rows
        return summed.narrow(ctx.dim, start, ctx.rows), None, None


def _timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, recording the seconds of its last call in ``wrapper.seconds`` (no functools.wraps)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            wrapper.seconds = time.perf_counter() - start  # type: ignore[attr-defined]

    return wrapper


timed_gather_with_sizes = _timed(gather_with_sizes)
