"""Hypothesis strategies for distributed tensor tests: shapes, dtypes, layouts, per-rank data.

Every strategy draws small examples (a few rows of a few columns) so that one
example costs milliseconds in a persistent world. Values are drawn as small
integer lists in the parent process and turned into CPU tensors; the tensors
are pickled to the ranks, so a failing example shrinks in the parent. Layouts
travel as names and are applied on the rank with :func:`apply_layout`.

This module imports torch and hypothesis; ``nemo_dist.testing`` does not import
it eagerly (use ``from nemo_dist.testing import strategies``).
"""

from __future__ import annotations

import array
import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from hypothesis import strategies as st

__all__ = [
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "LAYOUTS",
    "Values",
    "all_dtypes",
    "applies",
    "apply_layout",
    "float_dtypes",
    "layouts",
    "rank_tensors",
    "row_counts",
    "shapes",
    "upstream_grads",
]

#: Float dtypes with autograd, simplest first (hypothesis shrinks toward the first).
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

#: Every dtype a gather must move: the float dtypes, then integers and bool.
ALL_DTYPES: tuple[torch.dtype, ...] = (*FLOAT_DTYPES, torch.int64, torch.int32, torch.uint8, torch.bool)

#: Memory layout names understood by :func:`apply_layout`, simplest first.
LAYOUTS: tuple[str, ...] = ("contiguous", "transposed", "strided", "channels_last")

#: What ``rank_tensors`` fills tensors with (see its docstring).
Values = Literal["integers", "floats", "bits", "random"]

_SMALL_INT = 8  # |value| <= 8: exact in every float dtype, and so are sums of a few
_BITS_DTYPE = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


@functools.cache
def shapes(
    *, min_dims: int = 1, max_dims: int = 4, min_rows: int = 0, max_rows: int = 3, max_side: int = 3
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes of ``min_dims``..``max_dims`` dims, dim 0 (rows) in ``min_rows``..``max_rows``.

    Trailing dims are 1..``max_side`` so examples stay cheap. Shrinks toward fewer
    dims, then fewer rows (zero rows when allowed), then trailing dims of 1.
    """
    if not 1 <= min_dims <= max_dims:
        raise ValueError(f"shapes needs 1 <= min_dims <= max_dims, got {min_dims}, {max_dims}")
    return st.tuples(
        st.integers(min_rows, max_rows),
        st.lists(st.integers(1, max_side), min_size=min_dims - 1, max_size=max_dims - 1),
    ).map(_joined_shape)


def _joined_shape(parts: tuple[int, list[int]]) -> tuple[int, ...]:
    return (parts[0], *parts[1])


@functools.cache
def float_dtypes() -> st.SearchStrategy[torch.dtype]:
    """One of fp32, fp64, fp16, bf16; shrinks toward fp32."""
    return st.sampled_from(FLOAT_DTYPES)


@functools.cache
def all_dtypes() -> st.SearchStrategy[torch.dtype]:
    """A float dtype, int64, int32, uint8 or bool; shrinks toward fp32."""
    return st.sampled_from(ALL_DTYPES)


def applies(layout: str, shape: Sequence[int]) -> bool:
    """Whether ``layout`` (one of :data:`LAYOUTS`) applies to a tensor of ``shape``.

    "transposed" needs 2+ dims and "channels_last" exactly 4; the others apply to any shape.
    """
    if layout == "transposed":
        return len(shape) >= 2
    if layout == "channels_last":
        return len(shape) == 4
    return layout in LAYOUTS


def layouts(shape: Sequence[int]) -> st.SearchStrategy[str]:
    """A layout name from :data:`LAYOUTS` that applies to ``shape``; shrinks toward "contiguous".

    "transposed" needs 2+ dims and "channels_last" exactly 4.
    """
    return _layouts_of(tuple(name for name in LAYOUTS if applies(name, shape)))


@functools.cache
def _layouts_of(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(names)


def apply_layout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor equal to ``tensor`` (same shape, dtype, values) stored in ``layout``.

    "contiguous" returns a contiguous copy; "transposed" a view whose first and
    last dims are swapped in memory; "strided" every other element of a buffer
    twice as long in the last dim; "channels_last" torch's channels-last format
    (4-D only). The result is non-contiguous whenever the shape allows it (dims
    of size 0 or 1 can make any layout contiguous). Raises ``ValueError`` for an
    unknown layout or one that does not apply to the tensor's dims. The result
    does not require grad; call ``requires_grad_()`` on it to make a leaf.
    """
    tensor = tensor.detach()
    if not applies(layout, tensor.shape):
        raise ValueError(
            f"layout {layout!r} does not apply to a {tensor.dim()}-d tensor; "
            f"choose one of {[n for n in LAYOUTS if applies(n, tensor.shape)]}"
        )
    if layout == "contiguous":
        return tensor.contiguous().clone()
    if layout == "transposed":
        return tensor.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last).clone()
    buffer = torch.zeros((*tensor.shape[:-1], 2 * tensor.shape[-1]), dtype=tensor.dtype, device=tensor.device)
    buffer[..., ::2] = tensor
    return buffer[..., ::2]


def _tensor_from_ints(values: list[Any], shape: tuple[int, ...], dtype: torch.dtype, kind: Values) -> torch.Tensor:
    if kind == "bits":  # (is_bit_pattern, int) pairs: small integer values or raw bit patterns
        bits_dtype = _BITS_DTYPE[dtype]
        raw = torch.tensor([v for _, v in values], dtype=torch.int64)
        as_value = raw.to(dtype).view(bits_dtype)
        as_bits = raw.to(bits_dtype)
        is_bits = torch.tensor([b for b, _ in values], dtype=torch.bool)
        return torch.where(is_bits, as_bits, as_value).view(dtype).reshape(shape)
    if kind == "floats":  # multiples of 1/1024: not integer-valued, still small
        return (_int64(values).to(torch.float64) / 1024).to(dtype).reshape(shape)
    return _int64(values).to(dtype).reshape(shape)


def _int64(values: list[int]) -> torch.Tensor:
    """``torch.tensor(values, dtype=torch.int64)``, read from a typed buffer (a third of the time for long lists)."""
    if not values:
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(array.array("q", values), dtype=torch.int64)


@functools.cache
def _element_strategy(dtype: torch.dtype, kind: Values) -> st.SearchStrategy[Any]:
    if kind == "random":
        if not dtype.is_floating_point:
            raise ValueError(f"values='random' needs a float dtype, got {dtype}")
        return st.integers(0, 2**32 - 1)
    if kind == "bits":
        if dtype not in _BITS_DTYPE:
            raise ValueError(f"values='bits' needs a float dtype, got {dtype}")
        bits = torch.iinfo(_BITS_DTYPE[dtype]).bits
        return st.one_of(
            st.tuples(st.just(False), st.integers(-_SMALL_INT, _SMALL_INT)),
            st.tuples(st.just(True), st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)),
        )
    if kind == "floats":
        if not dtype.is_floating_point:
            raise ValueError(f"values='floats' needs a float dtype, got {dtype}")
        return st.integers(-4 * 1024, 4 * 1024)
    if dtype == torch.bool:
        return st.integers(0, 1)
    if dtype == torch.uint8:
        return st.integers(0, _SMALL_INT)
    return st.integers(-_SMALL_INT, _SMALL_INT)


@st.composite
def rank_tensors(
    draw: st.DrawFn,
    world_size: int,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    rows: Sequence[int] | None = None,
    values: Values = "integers",
) -> list[torch.Tensor]:
    """One contiguous CPU tensor per rank (a list of ``world_size``), each of ``shape`` and ``dtype``.

    ``rows`` (one count per rank) replaces dim 0 of ``shape`` per rank, for
    ``uneven=True``. ``values``: "integers" (default) are integers in -8..8
    (0..8 for uint8, 0/1 for bool), exact in every dtype, so sums of a few are
    exact; "floats" are multiples of 1/1024 in [-4, 4], not integer-valued, for
    tolerance checks; "bits" mixes small integers with any bit pattern of the
    float dtype (NaN, inf, -0.0, subnormals), for bit-exact copy checks, and
    shrinks toward the small integers; "random" are standard normal draws
    rounded to the float dtype (full-mantissa values, almost none exact in a
    lower precision), generated from one seed for all ranks, for precision
    checks: they shrink toward seed 0, never toward exact values. The other kinds
    shrink toward all zeros.
    """
    per_rank = list(rows) if rows is not None else [shape[0]] * world_size
    if len(per_rank) != world_size:
        raise ValueError(f"rank_tensors: rows has {len(per_rank)} counts for {world_size} ranks")
    elements = _element_strategy(dtype, values)
    if values == "random":  # one seed, one stream: every rank's values differ
        generator = torch.Generator().manual_seed(draw(elements))
        return [
            torch.randn((n, *shape[1:]), generator=generator, dtype=torch.float64).to(dtype) for n in per_rank
        ]
    tensors = []
    for n in per_rank:
        rank_shape = (n, *shape[1:])
        count = math.prod(rank_shape)
        ints = draw(_exactly(elements, count))
        tensors.append(_tensor_from_ints(ints, rank_shape, dtype, values))
    return tensors


@functools.cache
def _exactly(elements: st.SearchStrategy[Any], count: int) -> st.SearchStrategy[list[Any]]:
    """Lists of exactly ``count`` draws of ``elements`` (one strategy object per pair: hypothesis caches its work
    on the object, and a new one per draw costs more than the draw)."""
    return st.lists(elements, min_size=count, max_size=count)


@functools.cache
def row_counts(world_size: int, *, max_rows: int = 3) -> st.SearchStrategy[list[int]]:
    """Rows per rank for ``uneven=True``: ``world_size`` counts in 0..``max_rows``; shrinks toward zeros."""
    return st.lists(st.integers(0, max_rows), min_size=world_size, max_size=world_size)


def upstream_grads(
    world_size: int,
    out_shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    values: Values = "integers",
) -> st.SearchStrategy[list[torch.Tensor]]:
    """Per-rank upstream gradients of a gathered output of ``out_shape``: a list of ``world_size``.

    Each rank's gradient differs (the loss is asymmetric across ranks).
    Integer-valued by default so the sums of the gradient rule are exact; see
    :func:`rank_tensors` for ``values`` and how each kind shrinks.
    """
    return rank_tensors(world_size, out_shape, dtype, values=values)

