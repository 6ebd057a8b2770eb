"""All-gather on dim 0, with and without autograd.

``all_gather_with_grad(x)`` returns ``cat([x_0, ..., x_{W-1}], dim=0)`` on every
rank, where ``x_r`` is rank r's input.  Its backward applies the rule that makes
a loss over gathered features train like one process on the full batch: the
gradient of ``x`` on rank r is the sum over ranks s of the rows of rank r in
rank s's upstream gradient.  That sum is exactly a reduce-scatter, so the
default path is one single-buffer all-gather forward and one reduce-scatter
backward, with no extra collective and no host-device synchronisation.

``uneven=True`` lets the number of rows differ between ranks, at the cost of
one small metadata all-gather that also validates trailing dims and dtype on
every rank.  ``group=`` runs everything on a process group; ranks and sizes are
then the group's.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]

# torch 2.13 renamed the single-buffer collectives and deprecated the old names;
# older releases only have the old ones.  Resolve once, warning-free.
_all_gather_single: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single: Any = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# The uneven path exchanges a fixed-length metadata row per rank:
# [ndim, dtype code, dim_0, ..., dim_{_MAX_NDIM-1}] (unused dims are -1).
_MAX_NDIM = 16
_META_LEN = 2 + _MAX_NDIM


def _dtype_code(dtype: torch.dtype) -> int:
    # A stable code (unlike hash(), which is salted per process).
    return zlib.crc32(str(dtype).encode())


_DTYPE_BY_CODE = {
    _dtype_code(value): value for value in vars(torch).values() if isinstance(value, torch.dtype)
}


def _world(group: dist.ProcessGroup | None) -> tuple[int, int] | None:
    """(rank, size) in ``group``, or None when there is nothing to gather over."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            "all_gather: this process is not a member of the given group; "
            "call it only on the group's ranks"
        )
    if size == 1:
        return None
    return rank, size


def _check_tensor(x: Any, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _check_not_0d(x: torch.Tensor, name: str) -> None:
    if x.dim() == 0:
        raise ValueError(
            f"{name}: cannot gather a 0-d tensor on dim 0 (shape {tuple(x.shape)}); "
            "use x.reshape(1) to gather scalars"
        )


def _plan(
    x: Any, group: dist.ProcessGroup | None, uneven: bool, name: str
) -> tuple[int, int, tuple[int, ...] | None] | None:
    """Validate ``x`` and return (rank, size, rows per rank or None), or None for the identity.

    With ``uneven`` the shape checks happen after the metadata exchange, so that
    a bad shape on one rank raises on every rank instead of hanging the others.
    """
    _check_tensor(x, name)
    world = _world(group)
    if world is None or not uneven:
        _check_not_0d(x, name)
    if world is None:
        return None
    rank, size = world
    rows = _exchange_rows(x, group, size, name) if uneven else None
    if rows is not None and len(set(rows)) == 1:
        rows = None  # equal after all: the plain path, no padding
    return rank, size, rows


def _exchange_rows(
    x: torch.Tensor, group: dist.ProcessGroup | None, size: int, name: str
) -> tuple[int, ...]:
    """Gather every rank's shape and dtype; return rows per rank or raise on every rank."""
    meta = torch.full((_META_LEN,), -1, dtype=torch.int64)
    meta[0] = x.dim()
    meta[1] = _dtype_code(x.dtype)
    dims = list(x.shape)[:_MAX_NDIM]
    meta[2 : 2 + len(dims)] = torch.tensor(dims, dtype=torch.int64)
    meta = meta.to(x.device)
    gathered = torch.empty((size * _META_LEN,), dtype=torch.int64, device=x.device)
    _all_gather_single(gathered, meta, group=group)
    rows_meta = gathered.view(size, _META_LEN).tolist()

    described = []
    for r, row in enumerate(rows_meta):
        ndim, code = row[0], row[1]
        shape = tuple(row[2 : 2 + min(ndim, _MAX_NDIM)])
        dtype = _DTYPE_BY_CODE.get(code, f"<dtype code {code}>")
        described.append((r, ndim, shape, dtype))

    def listing() -> str:
        return ", ".join(f"rank {r}: shape {s} {d}" for r, _, s, d in described)

    if any(ndim == 0 for _, ndim, _, _ in described):
        bad = [r for r, ndim, _, _ in described if ndim == 0]
        raise ValueError(
            f"{name}(uneven=True): 0-d tensors cannot be gathered on dim 0 (ranks {bad}); {listing()}"
        )
    if any(ndim > _MAX_NDIM for _, ndim, _, _ in described):
        raise ValueError(f"{name}(uneven=True): at most {_MAX_NDIM} dims are supported; {listing()}")
    if len({s[1:] for _, _, s, _ in described}) > 1:
        raise ValueError(f"{name}(uneven=True): trailing dims (all but dim 0) differ between ranks; {listing()}")
    if len({str(d) for _, _, _, d in described}) > 1:
        raise ValueError(f"{name}(uneven=True): dtypes differ between ranks; {listing()}")
    return tuple(s[0] for _, _, s, _ in described)


def _gather(
    x: torch.Tensor, group: dist.ProcessGroup | None, size: int, rows: tuple[int, ...] | None
) -> torch.Tensor:
    """Forward: the rows of every rank, in rank order, in one new tensor."""
    x = x.contiguous()
    trailing = tuple(x.shape[1:])
    if rows is None:
        out = torch.empty((size * x.shape[0], *trailing), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x, group=group)
        return out
    most = max(rows)
    padded = x.new_zeros((most, *trailing))
    padded[: x.shape[0]] = x
    buffer = torch.empty((size * most, *trailing), dtype=x.dtype, device=x.device)
    _all_gather_single(buffer, padded, group=group)
    return torch.cat([buffer[r * most : r * most + n] for r, n in enumerate(rows)])


def _scatter_grad(
    grad: torch.Tensor,
    group: dist.ProcessGroup | None,
    rank: int,
    size: int,
    rows: tuple[int, ...] | None,
) -> torch.Tensor:
    """Backward: on rank r, the sum over ranks of their gradient rows for rank r."""
    if rows is None:
        grad = grad.contiguous()  # a copy only when it is not (expanded, transposed)
        out = torch.empty((grad.shape[0] // size, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        _reduce_scatter_single(out, grad, group=group)
        return out
    most = max(rows)
    trailing = tuple(grad.shape[1:])
    padded = grad.new_zeros((size * most, *trailing))
    offset = 0
    for r, n in enumerate(rows):
        padded[r * most : r * most + n] = grad[offset : offset + n]
        offset += n
    out = torch.empty((most, *trailing), dtype=grad.dtype, device=grad.device)
    _reduce_scatter_single(out, padded, group=group)
    return out[: rows[rank]]


class _GatherRows(torch.autograd.Function):
    """Autograd node of ``all_gather_with_grad``: one tensor out, one collective each way."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        group: dist.ProcessGroup | None,
        rank: int,
        size: int,
        rows: tuple[int, ...] | None,
    ) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.size, ctx.rows = group, rank, size, rows
        return _gather(x, group, size, rows)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _scatter_grad(grad, ctx.group, ctx.rank, ctx.size, ctx.rows), None, None, None, None


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather on dim-0 with autograd support across distributed ranks.

    ``forward(ctx, x, group=None)`` returns a tuple of W tensors, rank r's input
    at index r; every rank must pass the same shape.  ``backward(ctx, *grads)``
    returns the gradient for ``x``: the sum over ranks of their gradient for this
    rank's slice (one reduce-scatter).  Kept for callers of the upstream API;
    ``all_gather_with_grad`` skips the tuple and returns one tensor.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, ...]:
        _check_tensor(x, "_AllGatherWithGrad")
        _check_not_0d(x, "_AllGatherWithGrad")
        world = _world(group)
        ctx.group = group
        ctx.world = world
        if world is None:
            return (x.clone(),)
        gathered = _gather(x, group, world[1], None)
        # Separate tensors, as upstream returns: views of one buffer could not be
        # modified in place by the caller.
        return tuple(part.clone() for part in gathered.chunk(world[1]))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.world is None:
            return grads[0], None
        rank, size = ctx.world
        return _scatter_grad(torch.cat(grads), ctx.group, rank, size, None), None


def all_gather_with_grad(
    x: torch.Tensor, *, group: dist.ProcessGroup | None = None, uneven: bool = False
) -> torch.Tensor:
    """Gather ``x`` across ranks on dim-0 while preserving autograd.

    Returns ``cat([x_0, ..., x_{W-1}], dim=0)`` on every rank of ``group`` (the
    default group when None), a new tensor; the gradient of ``x`` on rank r is the
    sum over ranks s of rows ``r`` of their upstream gradient.  Every rank must
    call backward: it is a collective.  When torch.distributed is unavailable or
    not initialised, or the group has one rank, returns ``x`` itself.

    By default every rank must pass the same shape and dtype (one all-gather
    forward, one reduce-scatter backward, no host sync).  With ``uneven=True``
    dim 0 may differ between ranks; differing trailing dims or dtypes raise
    ``ValueError`` on every rank.  A 0-d ``x`` raises ``ValueError``.  The
    caller's tensors and incoming gradients are never modified.
    """
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    rank, size, rows = plan
    return _GatherRows.apply(x, group, rank, size, rows)


def all_gather_no_grad(
    x: torch.Tensor, *, group: dist.ProcessGroup | None = None, uneven: bool = False
) -> torch.Tensor:
    """Gather ``x`` across ranks on dim-0 without autograd.

    Same result as ``all_gather_with_grad`` but never part of the autograd graph
    (``requires_grad`` is False); any dtype the backend moves (ints, bool too).
    When torch.distributed is unavailable or not initialised, or the group has
    one rank, returns ``x.detach()`` (sharing ``x``'s storage).
    """
    plan = _plan(x, group, uneven, "all_gather_no_grad")
    if plan is None:
        return x.detach()
    _, size, rows = plan
    with torch.no_grad():
        return _gather(x.detach(), group, size, rows)
