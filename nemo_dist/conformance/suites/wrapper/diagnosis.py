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

from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.suites.wrapper.messages import AccumulationReport, NestedReport, Stepped, TrainReport

__all__ = [
    "CAUSES",
    "nested_cause",
    "no_sync_cause",
    "precision_cause",
    "reductions_below",
    "start_cause",
    "training_cause",
]

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
    "reduced_in": "gradients reduced in {dtype}: the backend's gradient reductions ran on {dtype} tensors "
    "({events}), below the declared --ddp-reduce-dtype {declared} (float32 unless declared); declare "
    "--ddp-reduce-dtype {dtype} if the wrapper means to (under pytest --conformance-ddp-reduce-dtype)",
    "computes_in": "the forward computed in {dtype} (its output is {dtype}, the parameters {params}): a "
    "mixed-precision wrapper; declare --ddp-compute-dtype {dtype} (under pytest --conformance-ddp-compute-dtype) "
    "for the training checks to allow {dtype}'s rounding",
    "stale": "the forward ran on stale parameters (the gradient of step {step} is the full-batch one at the "
    "starting weights: the updates never reach the weights the forward uses; FSDP2's reshard_after_forward=False "
    "with set_reshard_after_backward(False) keeps reusing the unsharded copies)",
    "mixed_reduction": "gradients of {names} {done} where {declared} was declared, the others' as declared: a "
    "reduction set on some modules only (FSDP2's set_gradient_divide_factor does not recurse into the child FSDP "
    "modules)",
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


def _unobserved_precision(results: Sequence[Stepped], observed: Sequence[Any], expected: Sequence[Any]) -> str:
    """:func:`_lower_precision` guessed from the values, where the ranks saw no reduction's dtype.

    Where they did, :func:`precision_cause` has already judged the dtypes
    themselves (none below the declared one), and values suggest nothing more.
    """
    if any(dtype for got in results for _, dtype in got.reduced):
        return ""
    return _lower_precision(observed, expected)


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


def _eps(dtype: str) -> float:
    """The machine epsilon of a floating dtype named as torch names it, with or without ``torch.``; 0 for others."""
    found = getattr(torch, dtype.removeprefix("torch."), None) if dtype else None
    return torch.finfo(found).eps if isinstance(found, torch.dtype) and found.is_floating_point else 0.0


def reductions_below(reduced: Sequence[tuple[str, str]], declared: str) -> list[tuple[str, str]]:
    """The ``(event, dtype)`` reductions of :func:`~.ranks.reductions` whose floating dtype is less precise than
    ``declared`` (``"float32"``)."""
    return [(event, dtype) for event, dtype in reduced if _eps(dtype) > _eps(declared)]


def precision_cause(results: Sequence[Stepped], wrapper: DDPWrapper) -> str:
    """"gradients reduced in DTYPE" when a rank's observed reductions ran below ``--ddp-reduce-dtype``; else "the
    forward computed in DTYPE" when the output came back in a less precise dtype than the parameters and no
    ``--ddp-compute-dtype`` was declared; else ""."""
    for got in results:
        low = reductions_below(got.reduced, wrapper.reduce_dtype)
        if low:
            events = ", ".join(sorted({event for event, _ in low}))
            return CAUSES["reduced_in"].format(dtype=low[0][1], events=events, declared=wrapper.reduce_dtype)
    output, params = results[0].output_dtype, results[0].dtype
    if wrapper.compute_dtype is None and _eps(output) > _eps(params) > 0:
        return CAUSES["computes_in"].format(dtype=output, params=params.removeprefix("torch."))
    return ""


def training_cause(results: Sequence[TrainReport], wrapper: DDPWrapper) -> str:
    """The likely cause of a training failure, from every rank's :func:`~.ranks.train` report.

    A start that was not broadcast first; then a reduction or a forward
    observed in a lower precision than declared (:func:`precision_cause`);
    else the gradients of the first step where a rank's differs from the
    full-batch one at its parameters.
    """
    size, reduction = len(results), wrapper.reduction
    found = start_cause([r.own for r in results], [r.start for r in results]) or precision_cause(
        results, wrapper
    )
    if found:
        return found
    for step in range(len(results[0].grads)):
        observed = [r.grads[step] for r in results]
        expected = [r.expected[step] for r in results]
        if any(g is None for g in observed):
            return ""
        if _all_close(observed, expected):
            continue
        starting = [r.expected[0] for r in results]
        if step and _all_close(observed, starting) and not _all_close(expected, starting):
            return CAUSES["stale"].format(step=step + 1)
        local = [r.locals[step] for r in results]
        if size >= 2 and _all_close(observed, local) and not _all_close(local, [local[0]] * size):
            return CAUSES["never_reduced"]
        return (
            _reduction_cause(observed, expected, reduction, size)
            or _plain_cause(observed, expected, local, results[0].layout)
            or _group_cause(observed, local, reduction)
            or _unobserved_precision(results, observed, expected)
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


def no_sync_cause(results: Sequence[AccumulationReport], wrapper: DDPWrapper) -> str:
    """The likely cause of a no_sync failure, from every rank's :func:`~.ranks.accumulation` report."""
    reduction = wrapper.reduction
    found = precision_cause(results, wrapper)
    if found:
        return found
    observed = [r.grad for r in results]
    if any(g is None for g in observed):
        return ""
    if len(results) >= 2 and _all_close(observed, [r.local_accumulation for r in results]):
        return CAUSES["never_reduced"]
    if _all_close(observed, [r.last_only for r in results]):
        return CAUSES["no_sync_lost"]
    if _all_close(observed, [r.unreduced_accumulation for r in results]):
        return CAUSES["no_sync_unreduced"]
    expected = [r.expected for r in results]
    return _reduction_cause(observed, expected, reduction, len(results)) or _unobserved_precision(
        results, observed, expected
    )


def nested_cause(results: Sequence[NestedReport], wrapper: DDPWrapper) -> str:
    """The likely cause of a nested-model failure, from every rank's :func:`~.nested.nested_training` report.

    A lower precision first (:func:`precision_cause`); else the parameters
    that after the first step hold the one-process run under the other
    reduction (a sum where a mean was declared, or the reverse) while the
    rest hold the declared one.
    """
    found = precision_cause(results, wrapper)
    if found or len(results) < 2:
        return found
    got = results[0]
    names = got.names
    declared = got.reference[0]
    other = got.other_first
    mine = got.params[0]
    switched = [
        name for name, a, d, o in zip(names, mine, declared, other, strict=True)
        if _close(a, o) and not _close(a, d)
    ]
    if not switched or len(switched) == len(names):
        return ""
    done = "summed" if wrapper.reduction == "mean" else "averaged"
    return CAUSES["mixed_reduction"].format(names=", ".join(switched), done=done, declared=wrapper.reduction)
