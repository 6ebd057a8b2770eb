"""Name the likely cause of a failing gather check by re-running its shrunk example in variants.

A shrunk example says *that* the gather is wrong; the variants say *how*:

- the same example with contiguous tensors: when it passes, the bug is
  "wrong only for non-contiguous upstream gradients" (or inputs);
- distinctive upstream gradients (each rank's rows carry their own powers of
  two), so the gradient each rank got can be matched against the classic
  mistakes: its own slice only (no cross-rank sum), the sum times W, the
  mean, another rank's slice or the reversed order;
- for a subgroup failure (:mod:`~nemo_dist.conformance.suites.gather.group_diagnosis`):
  the rows each member gathered, and the same data in the whole world;
- for a forward failure, inputs whose rows name their rank, so the output
  tells which ranks are missing (each rank's own rows, or the same ones on
  every rank), repeated or out of order, or that the dtype changed;
- for a precision failure (full-mantissa random values), the output compared
  with the inputs rounded through each lower precision, and upstream
  gradients with one contributing rank per element (so every summation order
  is exact): x.grad equal to those gradients rounded through a lower
  precision names the precision the reduction ran in.

Every function returns one line, or "" when the evidence names nothing. A
variant that fails in another way (raises, hangs) counts as no evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_dist.conformance.engine.deadlines import StepAborted
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.gather import ranks as ranks
from nemo_dist.conformance.suites.gather.messages import BackwardRun, Gathered
from nemo_dist.conformance.suites.gather.oracle import expected_grads, offsets, upstream_for_loss
from nemo_dist.conformance.suites.gather.precision import exact_grads, lower_precisions, reduction_bound, worst_error

__all__ = ["CAUSES", "backward_cause", "forward_cause", "precision_cause"]

#: The causes this module and :mod:`.group_diagnosis` can name (the first words of each line they return;
#: ``{via}`` and ``{dtype}``: dtype names; ``{cause}``: another cause; ``{rows}``: what members gathered).
CAUSES = {
    "reduced_in": "reduced in {via}: gradients match a {via} reduction of {dtype} values",
    "gathered_in": "gathered in {via}: the output is the {dtype} inputs rounded to {via}",
    "own": "no cross-rank sum (each rank keeps only its own loss's gradient)",
    "own_slot_summed": (
        "each rank's own slot summed across ranks (the backward all-reduces only its own rows of the upstream "
        "gradient, so every rank gets sum_s g_s[slot s] instead of sum_s g_s[slot r])"
    ),
    "own_rows_missing": "each rank's own rows are missing from its output (it gathers only the other ranks' rows)",
    "times_w": "scaled by W (the summed gradient is multiplied by the world size)",
    "mean": "mean instead of sum (the summed gradient is divided by the world size)",
    "reversed": "rank order reversed",
    "noncontiguous_grad": "wrong only for non-contiguous upstream gradients (it passes when they are contiguous)",
    "noncontiguous_input": "wrong only for non-contiguous inputs (it passes when they are contiguous)",
    "subgroup_global_rank": "wrong only inside a subgroup (global rank used where the group rank belongs)",
    "subgroup_first_member": (
        "wrong only in groups of interleaved ranks (the group rank taken as the global rank minus the group's "
        "first member's)"
    ),
    "subgroup_group_rank": "wrong only inside a subgroup (a group rank used where a global rank belongs)",
    "subgroup": "wrong only inside a subgroup (it passes in the whole world)",
    "subgroup_as_world": "{cause}, inside a subgroup as in the whole world (not a group rank mix-up)",
    "group_ignored": (
        "gathers over the whole world instead of the group (each member's output holds every rank's rows)"
    ),
    "group_wrong_rows": "rows of the wrong ranks gathered inside a subgroup ({rows})",
}


def _attempt(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None when it raises or hangs (no evidence either way)."""
    try:
        return fn()
    except (Exception, StepAborted):
        return None


def _close(actual: Any, candidate: torch.Tensor) -> bool:
    """Equal shapes and values within a few rounding errors of ``actual``'s dtype (the fork computes in it)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != candidate.shape:
        return False
    eps = torch.finfo(actual.dtype).eps if actual.dtype.is_floating_point else 0.0
    return bool(torch.allclose(actual.double(), candidate.double(), rtol=8 * eps, atol=1e-12))


def _distinct_grads(size: int, out_shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Rank s's upstream gradient: row i holds 2**s * (i + 1), so every linear mix-up is visible."""
    rows = torch.arange(1, out_shape[0] + 1, dtype=torch.float64).reshape(-1, *([1] * (len(out_shape) - 1)))
    return [(2.0**s * rows).expand(out_shape).to(dtype).clone() for s in range(size)]


def _grads_correct(got: Sequence[Any], expected: Sequence[torch.Tensor]) -> bool:
    return all(_close(g, e) for g, e in zip(got, expected, strict=True))


def _run_backward(
    world: WorldLike, impl: Implementation, inputs: Sequence[torch.Tensor], layout: str,
    grads: Sequence[torch.Tensor], grad_layout: str, loss: str, prefix: int,
) -> list[Any] | None:
    results: list[BackwardRun] | None = _attempt(
        lambda: world.run(ranks.backward, impl, inputs, layout, grads, grad_layout, loss, prefix)
    )
    return None if results is None else [r.grad for r in results]


def _formula(got: Sequence[Any], grads: Sequence[torch.Tensor], rows: Sequence[int]) -> str:
    """Match per-rank gradients against the classic mistakes on distinctive upstream gradients."""
    size = len(rows)
    expected = expected_grads(grads, rows)
    starts = offsets(rows)
    own = [grads[r][starts[r] : starts[r + 1]] for r in range(size)]
    summed_own = torch.stack([o.double() for o in own]).sum(0) if len(set(rows)) == 1 else None
    for key, candidate in (
        ("own_slot_summed", [summed_own] * size if summed_own is not None else []),
        ("own", own),
        ("times_w", [e.double() * size for e in expected]),
        ("mean", [e.double() / size for e in expected]),
    ):
        if candidate and all(_close(g, c) for g, c in zip(got, candidate, strict=True)):
            return CAUSES[key]
    sources: list[int] = []
    for r in range(size):
        matching = [q for q in range(size) if rows[q] == rows[r] and _close(got[r], expected[q])]
        if len(matching) != 1:
            return ""
        sources.append(matching[0])
    if sources == list(range(size)):
        return ""
    if sources == list(reversed(range(size))):
        return f"{CAUSES['reversed']} (rank r gets the gradient rows of rank W-1-r)"
    pairs = ", ".join(f"rank {r} gets rank {q}'s" for r, q in enumerate(sources) if q != r)
    return f"another rank's slice ({pairs} gradient rows)"


def backward_cause(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The likely cause of a failing backward example (keys: ``_gather_ranks.backward``'s arguments, shape, dtype)."""
    size = world.size
    if size < 2:
        return ""
    shape, dtype = tuple(example["shape"]), example["dtype"]
    inputs, layout = example["inputs"], example["layout"]
    grads, grad_layout = example["grads"], example["grad_layout"]
    loss, prefix = example["loss"], example.get("prefix", 0)
    rows = [shape[0]] * size
    out_shape = (size * shape[0], *shape[1:])
    noncontiguous_grad = grad_layout != "contiguous" or loss == "sum"
    if noncontiguous_grad:
        upstream = [g.contiguous() for g in upstream_for_loss(grads, loss, prefix, out_shape, dtype)]
        got = _run_backward(world, impl, inputs, layout, upstream, "contiguous", "direct", 0)
        if got is not None and _grads_correct(got, expected_grads(upstream, rows)):
            return CAUSES["noncontiguous_grad"]
    if layout != "contiguous":
        upstream = upstream_for_loss(grads, loss, prefix, out_shape, dtype)
        got = _run_backward(world, impl, inputs, "contiguous", grads, grad_layout, loss, prefix)
        if got is not None and _grads_correct(got, expected_grads(upstream, rows)):
            return CAUSES["noncontiguous_input"]
    variant_shape = (max(shape[0], 1), *shape[1:])
    variant_rows = [variant_shape[0]] * size
    variant_out = (size * variant_shape[0], *variant_shape[1:])
    distinct = _distinct_grads(size, variant_out, dtype)
    zeros = [torch.zeros(variant_shape, dtype=dtype) for _ in range(size)]
    got = _run_backward(world, impl, zeros, "contiguous", distinct, "contiguous", "direct", 0)
    return "" if got is None else _formula(got, distinct, variant_rows)


def forward_cause(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The likely cause of a failing forward example (keys: dtype, layout, inputs, no_grad, outputs)."""
    dtype = example["dtype"]
    outputs = example.get("outputs") or []
    changed = sorted({str(o.dtype) for o in outputs if isinstance(o, torch.Tensor) and o.dtype != dtype})
    if changed:
        return f"dtype changed ({dtype} in, {', '.join(changed)} out)"
    size = world.size
    if size < 2:
        return ""
    shape = (2, 3)
    inputs = [torch.full(shape, 100.0 * (r + 1)) + torch.arange(shape[0]).reshape(-1, 1) for r in range(size)]
    results: list[Gathered] | None = _attempt(
        lambda: world.run(ranks.forward, impl, inputs, "contiguous", no_grad=example["no_grad"], requires_grad=False)
    )
    if results is None:
        return ""
    per_rank = [_row_sources(result.out, inputs) for result in results]
    if size > 1 and all(sources == [q for q in range(size) if q != r] for r, sources in enumerate(per_rank)):
        return CAUSES["own_rows_missing"]
    sources = per_rank[0]
    if sources is None:
        return ""
    where = "" if all(other == sources for other in per_rank) else " on rank 0"
    if sources == list(range(size)):
        if example["layout"] != "contiguous" and not where:
            return CAUSES["noncontiguous_input"]
        return ""
    if sources == list(reversed(range(size))):
        return f"{CAUSES['reversed']} (the output{where} holds rank W-1's rows first)"
    missing = [r for r in range(size) if r not in sources]
    repeated = sorted({r for r in sources if sources.count(r) > 1})
    if missing and not repeated and sources == [r for r in range(size) if r not in missing]:
        return f"rank {', '.join(map(str, missing))}'s rows missing from the output{where}"
    parts = [f"ranks in the output{where}: {sources}"]
    if missing:
        parts.append(f"missing {missing}")
    if repeated:
        parts.append(f"repeated {repeated}")
    return "ranks out of order (" + "; ".join(parts) + ")"


def _row_sources(out: Any, inputs: Sequence[torch.Tensor]) -> list[int] | None:
    """The rank each block of rows of ``out`` came from, or None when a block matches no rank's input."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[1:] != inputs[0].shape[1:]:
        return None
    n = inputs[0].shape[0]
    if out.shape[0] % n:
        return None
    sources = []
    for start in range(0, out.shape[0], n):
        block = out[start : start + n].double()
        match = [r for r, x in enumerate(inputs) if torch.equal(block, x.double())]
        if len(match) != 1:
            return None
        sources.append(match[0])
    return sources


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _one_contributor_grads(size: int, out_shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Full-mantissa upstream gradients where each element is nonzero on one rank only (element i on rank i % W).

    Every order of summing them is exact, so a correct x.grad equals them bit
    for bit, and a reduction in a lower precision returns them rounded to it.
    """
    values = torch.randn(out_shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    owner = torch.arange(values.numel()).reshape(out_shape) % size
    return [torch.where(owner == s, values, torch.zeros_like(values)) for s in range(size)]


def _gathered_in(example: dict[str, Any]) -> str:
    """The lower precision whose rounding of the inputs every rank's output equals, as a cause; "" for none."""
    dtype, outputs = example["dtype"], example.get("outputs") or []
    expected = torch.cat(example["inputs"])
    for via in lower_precisions(dtype):
        rounded = expected.to(via).to(dtype)
        if not ranks.same_bits(rounded, expected) and outputs and all(
            isinstance(o, torch.Tensor) and ranks.same_bits(o, rounded) for o in outputs
        ):
            return CAUSES["gathered_in"].format(via=_name(via), dtype=_name(dtype))
    return ""


def _reduced_in(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The lower precision the gradients were reduced in, as a cause with the error and bound; "" for none.

    Named only when the one-contributor variant's x.grad is, bit for bit, its
    gradients rounded to that precision on every rank, and the failing
    example's error is within that precision's own reduction bound.
    """
    size, dtype, shape = world.size, example["dtype"], tuple(example["shape"])
    candidates = lower_precisions(dtype)
    if size < 2 or not candidates:
        return ""
    rows = [shape[0]] * size
    out_shape = (size * shape[0], *shape[1:])
    variant = _one_contributor_grads(size, out_shape, dtype)
    got = _run_backward(world, impl, example["inputs"], "contiguous", variant, "contiguous", "direct", 0)
    if got is None:
        return ""
    correct = expected_grads(variant, rows)  # exact: one term per element
    grads, failing = example["grads"], example["got"]
    exact = exact_grads(grads, rows)
    for via in candidates:
        rounded = [c.to(via).to(dtype) for c in correct]
        if all(ranks.same_bits(c, r) for c, r in zip(correct, rounded, strict=True)):
            continue  # the variant cannot tell this precision apart
        if not all(isinstance(g, torch.Tensor) and ranks.same_bits(g, r) for g, r in zip(got, rounded, strict=True)):
            continue
        lower_bound = reduction_bound(grads, rows, via)
        if not all(
            isinstance(g, torch.Tensor) and bool(((g.double() - e).abs() <= b).all())
            for g, e, b in zip(failing, exact, lower_bound, strict=True)
        ):
            continue
        _, error, bound = worst_error(failing, exact, reduction_bound(grads, rows, dtype))
        line = CAUSES["reduced_in"].format(via=_name(via), dtype=_name(dtype))
        return f"{line} (error {error:.2g}, bound {bound:.2g})"
    return ""


def precision_cause(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The likely cause of a failing precision example (keys: shape, dtype, inputs, grads, outputs, got, part).

    ``part`` is "forward" or "backward". A forward that returns its inputs
    rounded through a lower precision is "gathered in" it; a backward whose
    gradients were rounded through one is "reduced in" it, with the failing
    example's worst error and its bound. Otherwise the causes of
    :func:`forward_cause` or :func:`backward_cause`.
    """
    if example["part"] == "forward":
        return _gathered_in(example) or forward_cause(world, impl, example)
    return _reduced_in(world, impl, example) or backward_cause(world, impl, example)
