"""Name the likely cause of a failing wrapper check from what the ranks reported.

The rank functions (:mod:`.ranks`) report, beside what the wrapper did, the
quantities the classic mistakes would have produced: each rank's own
initial weights (a wrapper that broadcasts nothing keeps them), its own
local gradient (a wrapper that never reduces leaves it), the full-batch
gradient under the declared reduction (W times it: a sum where a mean was
declared; a W-th of it: the reverse, or a mean divided twice), and for
``no_sync`` the gradient of the synced micro-batch alone. A reduced
gradient whose every element is a bfloat16, float16 or float32 value, off
the exact one by that precision's rounding, was reduced in that precision.
Each function returns one line, or "" when the evidence names nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["CAUSES", "no_sync_cause", "start_cause", "training_cause"]

#: The causes this module can name (the first words of each line it returns).
CAUSES = {
    "no_broadcast": "nothing broadcast at start (each rank keeps its own initial weights): the wrapper does not "
    "synchronise the start; if it is meant to start from identical weights (the same seed on every rank, or a "
    "checkpoint load, as fully_shard expects), declare it with --ddp-start identical (under pytest "
    "--conformance-ddp-start identical)",
    "sum_for_mean": "sum where mean was declared (the ranks' gradients are summed: W times their mean)",
    "mean_for_sum": "mean where sum was declared (the ranks' gradients are averaged: their sum divided by W)",
    "over_w": "scaled by 1/W (the averaged gradient is divided by the world size once more)",
    "lower_precision": "gradients reduced in {dtype} (every reduced gradient is a {dtype} value, {dtype}'s "
    "rounding off the exact one)",
    "never_reduced": "gradients never reduced (each rank keeps its own local gradient)",
    "plain_never_reduced": "gradients of the plain (unsharded) parameters {names} never reduced (each rank keeps "
    "its own local gradient of them), while those of the sharded DTensor parameters are: a parameter left out of "
    "the sharding (an unsharded root's own, an ignored one) is not synchronised",
    "group_only": "gradients reduced within groups of {k} ranks only ({layout} groups, rank 0's: {group}), never "
    "across them: the groups (an HSDP mesh's replicas) train apart and diverge",
    "no_sync_lost": "no_sync loses gradients (only the synced micro-batch's gradient is left, reduced)",
    "no_sync_unreduced": (
        "the gradients accumulated under no_sync are never reduced (the synced step reduces only its own micro-batch)"
    ),
}

_LOWER = (torch.bfloat16, torch.float16, torch.float32)


def _close(actual: Any, candidate: Any) -> bool:
    """Both tensors of one shape, equal within float64 rounding of a few sums."""
    if not isinstance(actual, torch.Tensor) or not isinstance(candidate, torch.Tensor):
        return False
    if actual.shape != candidate.shape:
        return False
    return bool(torch.allclose(actual.double(), candidate.double(), rtol=1e-9, atol=1e-12))


def _all_close(actuals: Sequence[Any], candidates: Sequence[Any]) -> bool:
    return bool(actuals) and all(_close(a, c) for a, c in zip(actuals, candidates, strict=True))


def _representable(values: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every element of ``values`` is a value of ``dtype`` (finite, unchanged by a round trip)."""
    rounded = values.to(dtype).to(values.dtype)
    return bool(torch.isfinite(rounded).all() and torch.equal(rounded, values))


def _lower_precision(observed: Sequence[Any], expected: Sequence[Any]) -> str:
    """The precision every observed gradient lies in, off the expected one by that precision's rounding; "" if none.

    "By its rounding": within (W + 2) eps of the largest expected element, the
    bound of a W-term sum rounded in that precision plus the casts around it.
    """
    tensors = [*observed, *expected]
    if not observed or not all(isinstance(t, torch.Tensor) for t in tensors) or _all_close(observed, expected):
        return ""
    bound = len(observed) + 2
    for dtype in _LOWER:
        eps = torch.finfo(dtype).eps
        fits = True
        for got, wanted in zip(observed, expected, strict=True):
            scale = float(wanted.abs().max()) if wanted.numel() else 0.0
            near = torch.allclose(got.double(), wanted.double(), rtol=0.0, atol=bound * eps * scale)
            if not (near and _representable(got.double(), dtype)):
                fits = False
                break
        if fits:
            name = str(dtype).removeprefix("torch.")
            return CAUSES["lower_precision"].format(dtype=name)
    return ""


def start_cause(own: Sequence[Any], start: Sequence[Any]) -> str:
    """"nothing broadcast" when ranks built different weights and a rank other than 0 does not hold rank 0's.

    It still holds its own (a replicating wrapper), or a whole assembled from
    every rank's shards of their own weights (a sharding one: a DTensor's full
    tensor mixes them).
    """
    for rank in range(1, len(own)):
        if _close(own[rank], own[0]) or not isinstance(start[rank], type(own[0])):
            continue
        if _close(start[rank], own[rank]) or not _close(start[rank], own[0]):
            return CAUSES["no_broadcast"]
    return ""


def _reduction_cause(observed: Sequence[Any], expected: Sequence[Any], reduction: str, size: int) -> str:
    """Which scaling of the expected gradient the observed one is (W times, a W-th), under ``reduction``."""
    if size < 2:
        return ""
    if _all_close(observed, [e * size for e in expected]):
        return CAUSES["sum_for_mean"] if reduction == "mean" else ""
    if _all_close(observed, [e / size for e in expected]):
        return CAUSES["over_w"] if reduction == "mean" else CAUSES["mean_for_sum"]
    return ""


def training_cause(results: Sequence[dict[str, Any]], reduction: str) -> str:
    """The likely cause of a training failure, from every rank's :func:`~.ranks.train` report.

    A start that was not broadcast first; else the gradients of the first
    step where a rank's differs from the full-batch one at its parameters.
    """
    size = len(results)
    found = start_cause([r["own"] for r in results], [r.get("start") for r in results])
    if found:
        return found
    for step in range(len(results[0]["grads"])):
        observed = [r["grads"][step] for r in results]
        expected = [r["expected"][step] for r in results]
        if any(g is None for g in observed):
            return ""
        if _all_close(observed, expected):
            continue
        local = [r["locals"][step] for r in results]
        if size >= 2 and _all_close(observed, local) and not _all_close(local, [local[0]] * size):
            return CAUSES["never_reduced"]
        return (
            _reduction_cause(observed, expected, reduction, size)
            or _plain_cause(observed, expected, local, results[0].get("layout", ()))
            or _group_cause(observed, local, reduction)
            or _lower_precision(observed, expected)
        )
    return ""


def _segments(layout: Sequence[tuple[str, int, bool]]) -> list[tuple[str, slice, bool]]:
    """Each parameter's slice of a flattened vector (weight rows then bias, in parameter order)."""
    found, start = [], 0
    for name, numel, sharded in layout:
        found.append((name, slice(start, start + numel), sharded))
        start += numel
    return found


def _plain_cause(
    observed: Sequence[Any], expected: Sequence[Any], local: Sequence[Any], layout: Sequence[tuple[str, int, bool]]
) -> str:
    """The plain parameters among DTensors whose gradients stayed local while every DTensor one was reduced; ""."""
    segments = _segments(layout)
    if len(observed) < 2 or not any(s for _, _, s in segments) or all(s for _, _, s in segments):
        return ""
    plain = [(name, part) for name, part, sharded in segments if not sharded]
    sharded = [part for _, part, is_sharded in segments if is_sharded]
    if not all(_all_close([o[p] for o in observed], [e[p] for e in expected]) for p in sharded):
        return ""
    stayed = [
        name for name, part in plain
        if _all_close([o[part] for o in observed], [g[part] for g in local])
        and not _all_close([g[part] for g in local], [g[part] for g in expected])
    ]
    return CAUSES["plain_never_reduced"].format(names=", ".join(stayed)) if stayed else ""


def _group_cause(observed: Sequence[Any], local: Sequence[Any], reduction: str) -> str:
    """Groups of k ranks (contiguous or strided, 1 < k < W) within which alone the gradients were reduced; ""."""
    size = len(observed)
    for k in range(2, size):
        if size % k:
            continue
        for layout in ("contiguous", "strided"):
            groups = (
                [list(range(g * k, (g + 1) * k)) for g in range(size // k)]
                if layout == "contiguous"
                else [list(range(g, size, size // k)) for g in range(size // k)]
            )
            divisor = k if reduction == "mean" else 1
            candidate: list[Any] = [None] * size
            for group in groups:
                reduced = sum(local[r] for r in group) / divisor
                for r in group:
                    candidate[r] = reduced
            if _all_close(observed, candidate):
                return CAUSES["group_only"].format(k=k, layout=layout, group=groups[0])
    return ""


def no_sync_cause(results: Sequence[dict[str, Any]], reduction: str) -> str:
    """The likely cause of a no_sync failure, from every rank's :func:`~.ranks.accumulation` report."""
    observed = [r.get("grad") for r in results]
    if any(g is None for g in observed):
        return ""
    if len(results) >= 2 and _all_close(observed, [r["local_accumulation"] for r in results]):
        return CAUSES["never_reduced"]
    if _all_close(observed, [r["last_only"] for r in results]):
        return CAUSES["no_sync_lost"]
    if _all_close(observed, [r["unreduced_accumulation"] for r in results]):
        return CAUSES["no_sync_unreduced"]
    expected = [r["expected"] for r in results]
    return _reduction_cause(observed, expected, reduction, len(results)) or _lower_precision(observed, expected)
