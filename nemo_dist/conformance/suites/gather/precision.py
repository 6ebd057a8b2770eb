"""The gather's precision contract: the exact reference, the bound on a correct reduction, the lower precisions.

Forward is a copy, so it is exact on any value. Backward sums W upstream
gradients (one per rank) for each element of x.grad; that sum rounds, so a
correct gather is held to :func:`reduction_bound` around :func:`exact_grads`.
A gather that casts its gradients to a lower precision for the reduction
(float64 reduced in float32, float32 in bfloat16 or float16) exceeds that
bound by orders of magnitude on full-mantissa values, and its result is what
a reduction in one of :func:`lower_precisions` gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nemo_dist.conformance.suites.gather.oracle import offsets

__all__ = ["exact_grads", "lower_precisions", "reduction_bound", "worst_error"]

# Float dtypes by decreasing mantissa precision (float16 has 3 bits more than bfloat16, less range).
_BY_PRECISION = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _per_rank(total: torch.Tensor, rows: Sequence[int]) -> list[torch.Tensor]:
    starts = offsets(rows)
    return [total[starts[r] : starts[r + 1]] for r in range(len(rows))]


def exact_grads(upstream: Sequence[torch.Tensor], rows: Sequence[int]) -> list[torch.Tensor]:
    """The gradient rule in float64, each element the exact sum over ranks correctly rounded (``math.fsum``).

    On rank r: the sum over ranks s of rank r's rows of ``upstream[s]``. Exact
    then rounded once, so it is a reference for float64 gradients too.
    """
    stacked = torch.stack([g.double() for g in upstream])
    columns = stacked.reshape(len(upstream), -1).T.tolist()
    total = torch.tensor([math.fsum(c) for c in columns], dtype=torch.float64).reshape(stacked.shape[1:])
    return _per_rank(total, rows)


def reduction_bound(upstream: Sequence[torch.Tensor], rows: Sequence[int], dtype: torch.dtype) -> list[torch.Tensor]:
    """Elementwise bound on ``|x.grad - exact|`` for a correct gather: ``W * eps * sum_s |g_s| + W * eps * tiny``.

    ``W`` is the number of ranks, ``eps`` and ``tiny`` (the smallest normal
    number) are ``torch.finfo(dtype)``'s, ``g_s`` is rank s's upstream gradient
    at the element and ``exact`` is :func:`exact_grads`. Summing W terms in
    ``dtype`` in any order (ring, tree, all at once) rounds W-1 times with unit
    roundoff ``u = eps / 2``, an error of at most ``(W-1) u / (1 - (W-1) u) *
    sum_s |g_s|``; accumulating wider and rounding once to ``dtype`` costs
    ``u * |sum|`` more. The bound allows about twice that, so a correct
    reduction in the gradient's own dtype never exceeds it (bfloat16, with
    eps = 2**-7, included; ``tests/conformance/test_precision.py`` sums in every
    order and in float32 to check), while a reduction in a lower precision
    (its ``eps`` 2**29 times float64's, 2**16 times float32's for bfloat16) does
    on full-mantissa values. The ``tiny`` term covers results rounded among
    subnormals. Returns one float64 tensor per rank.
    """
    world = len(upstream)
    info = torch.finfo(dtype)
    magnitude = torch.stack([g.double().abs() for g in upstream]).sum(0)
    total = world * info.eps * magnitude + world * info.eps * info.tiny
    return _per_rank(total, rows)


def lower_precisions(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """The float dtypes with fewer mantissa bits than ``dtype``, most precise first (empty for bfloat16)."""
    if dtype not in _BY_PRECISION:
        return ()
    return _BY_PRECISION[_BY_PRECISION.index(dtype) + 1 :]


def worst_error(
    got: Sequence[torch.Tensor], exact: Sequence[torch.Tensor], bound: Sequence[torch.Tensor]
) -> tuple[int, float, float]:
    """``(rank, error, bound)`` at the element whose error is the largest multiple of its bound, over every rank.

    ``(0, 0.0, 0.0)`` when there is no element.
    """
    worst = (0, 0.0, 0.0)
    ratio = -1.0
    for r, (g, e, b) in enumerate(zip(got, exact, bound, strict=True)):
        if g.numel() == 0:
            continue
        error = (g.double() - e).abs().flatten()
        ratios = error / b.flatten()
        i = int(ratios.argmax())
        if float(ratios[i]) > ratio:
            ratio, worst = float(ratios[i]), (r, float(error[i]), float(b.flatten()[i]))
    return worst
