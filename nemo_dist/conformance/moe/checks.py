"""Conformance checks of expert parallelism: a mixture-of-experts layer under ``--moe-fn`` against one process.

Each world runs two token schedules (tokens per rank uneven, one rank with
none; with 12 experts, top-2 and at most 6 tokens a rank, some experts get
no tokens) through :func:`~nemo_dist.conformance.moe.ranks.run`; the checks
read that one run. Tolerances: the suite's layer is float64 throughout, and
an expert-parallel layer adds the same products in another order than one
process, so outputs, losses, gradients and parameters after steps are held
to 1e-10 relative to ``max(1, max |expected|)``, or to the rounding of a
declared ``--moe-compute-dtype`` (:func:`~nemo_dist.conformance.moe.target.tolerance`);
replicated parameters after steps are compared by their bytes across ranks.
A float64 run whose every difference is within float32's rounding names
that as its likely cause, not a bug of the dispatch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from nemo_dist.conformance.errors import NotApplicable
from nemo_dist.conformance.implementation import Implementation
from nemo_dist.conformance.moe import ranks
from nemo_dist.conformance.moe.local import LABEL
from nemo_dist.conformance.moe.target import dtype_tolerance, tolerance
from nemo_dist.conformance.registry import WorldLike, WorldRule, check, with_likely_cause

__all__ = [
    "CAUSES",
    "experts_sharded_over_ep",
    "forward_equals_one_process",
    "gradients_equal_one_process",
    "prepare",
    "trains_like_one_process",
]

#: Tokens per rank of each schedule (the first W entries in a world of W).
SCHEDULES: tuple[tuple[int, ...], ...] = ((5, 0, 3, 1), (2, 6, 0, 4))
STEPS = (("sgd", 1), ("adam", 1))
#: Experts of the suite's layer: a world whose size does not divide them cannot hold whole experts per rank.
EXPERTS = 12

EXPERTS_SPLIT = WorldRule(
    lambda size: EXPERTS % size == 0, f"the suite's {EXPERTS} experts do not split over {{size}} ranks"
)

ROUTER = (
    "the router's gradient is wrong while the experts' are right: the routing weights reach the loss through "
    "something outside autograd (probabilities moved with a plain collective, or detached), the auxiliary "
    "loss never reaches the router, or a replicated router's per-rank gradient is never summed (a Partial "
    "gradient marked Replicate)"
)
EXPERT = (
    "expert gradients wrong: the backward of the dispatch or combine does not return each token's gradient to "
    "its expert (splits not swapped, rows permuted), or an expert's gradient is reduced again over ranks that "
    "hold different experts"
)

#: What a float32 computation may differ by (the tolerance ``--moe-compute-dtype float32`` allows).
FLOAT32_TOLERANCE = dtype_tolerance("float32")
ROUNDING = (
    "every difference (at most {largest:.3g}) is within float32's rounding ({allowed:.3g}): the layer computes, "
    "gathers or adds up in float32 somewhere while its parameters are float64; if it does so by design, declare "
    "--moe-compute-dtype float32 (under pytest --conformance-moe-compute-dtype float32)"
)
AUX = (
    "the output is right and the auxiliary loss is not: expert parallelism changed which tokens the load-balance "
    "loss is taken over (the whole group's rather than this rank's, as one process on this rank's tokens takes it) "
    "or how it is computed"
)
TOKENS = (
    "the tokens' gradient is wrong while the parameters' are right: the gather that brings tokens to the experts "
    "has a backward that keeps this rank's slice of the gradient (full_tensor()'s backward, Replicate to Shard) "
    "where every rank's gradient of those rows must be summed first (a reduce-scatter), or the combine's backward "
    "returns the rows to the wrong tokens"
)

CAUSES = {
    "forward_equals_one_process": "tokens sent to the wrong expert or combined into the wrong place: the expert "
    "a rank owns computed from the global index, the combine's order not inverted, or tokens of a rank with none "
    "mishandled",
    "gradients_equal_one_process": EXPERT,
    "trains_like_one_process": "parameters apart from one process after steps: a gradient wrong by a factor "
    "(reduced twice), or replicated parameters stepped from gradients that differ per rank",
    "experts_sharded_over_ep": "the experts not sharded over the expert-parallel mesh, each rank's shard not the "
    "chunk its placement says, or the weights changed by sharding",
}

_RUNS: dict[tuple[int, Implementation, tuple[int, ...]], list[dict[str, Any]]] = {}


def _runs(world: WorldLike, impl: Implementation) -> list[tuple[tuple[int, ...], list[dict[str, Any]]]]:
    """Every schedule's per-rank reports in this world (run once per world size and target, shared by the checks)."""
    found = []
    for schedule in SCHEDULES:
        counts = schedule[: world.size]
        key = (world.size, impl, counts)
        if key not in _RUNS:
            _RUNS[key] = world.run(ranks.run, impl, list(counts), 7 + sum(counts), STEPS)
        reports = _RUNS[key]
        raised = [(r, f) for r, f in enumerate(reports) if "error" in f]
        if raised:
            _rank, first = raised[0]
            raise AssertionError(
                f"tokens per rank {list(counts)}: the target raised {first['where']} on rank"
                f"{'s' if len(raised) > 1 else ''} {', '.join(str(r) for r, _ in raised)}: {first['error']}"
            )
        found.append((counts, reports))
    return found


def _off(differences: dict[str, float | None], impl: Implementation) -> tuple[list[str], float]:
    """What is off by more than the tolerance, worded, and the largest difference (inf for a wrong shape)."""
    allowed = tolerance(impl)
    wrong = {name: d for name, d in differences.items() if d is None or d > allowed}
    words = [f"{name} " + ("of the wrong shape" if d is None else f"off by {d:.3g} (tolerance {allowed:.3g})")
             for name, d in wrong.items()]
    return words, max((float("inf") if d is None else d for d in wrong.values()), default=0.0)


def _check_close(differences: dict[str, float | None], impl: Implementation, where: str,
                 cause: str | Callable[[list[str]], str | None] | None = None) -> None:
    """Fail naming what is off (``where`` first) when something is; the likely cause is float32's rounding when
    every difference is within it and no lower compute dtype was declared, else ``cause`` (or ``cause(wrong)``)
    when it names one, else the check's own."""
    wrong, largest = _off(differences, impl)
    if not wrong:
        return
    message = f"{where}{', '.join(wrong)}"
    if tolerance(impl) < FLOAT32_TOLERANCE and largest <= FLOAT32_TOLERANCE:
        raise _failure(message, ROUNDING.format(largest=largest, allowed=FLOAT32_TOLERANCE))
    named = cause(wrong) if callable(cause) else cause
    raise _failure(message, named) if named else AssertionError(message)


def moe_check(name: str, *, rule: WorldRule | None = EXPERTS_SPLIT) -> Callable[[Callable[..., None]], Any]:
    """Register check ``moe.NAME`` (component ``moe``); its failures name ``CAUSES[NAME]``."""
    cause = CAUSES[name.removeprefix("moe.")]

    def register(run: Callable[..., None]) -> Any:
        return check(name, tier="core", component="moe", rule=rule)(with_likely_cause(run, cause))

    return register


def _failure(message: str, cause: str) -> AssertionError:
    exc = AssertionError(message)
    exc.likely_cause = cause  # type: ignore[attr-defined]
    return exc


def _changed(reports: list[dict[str, Any]], impl: Implementation) -> str | None:
    """The sharding check's cause when sharding already changed the weights on some rank (every later difference
    follows from that), else None."""
    changed = any(f["local_problems"] or _off(f["start"], impl)[0] for f in reports)
    return CAUSES["experts_sharded_over_ep"] if changed else None


@moe_check("moe.forward_equals_one_process")
def forward_equals_one_process(world: WorldLike, impl: Implementation) -> None:
    """Each rank's output and auxiliary load-balance loss equal one process's on that rank's tokens."""
    for counts, reports in _runs(world, impl):
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            where = f"tokens per rank {list(counts)}, rank {rank}: "
            _check_close({"output": found["out"]}, impl, where, changed)
            if found["has_aux"]:
                _check_close({"aux loss": found["aux"]}, impl, where, changed or AUX)


def _router_only(placements: dict[str, str], wrong: list[str]) -> str | None:
    """:data:`ROUTER` when every wrong gradient is a replicated parameter's (plain, or sharded nowhere)."""
    plain = {n for n, p in placements.items() if p == "plain" or ("Shard" not in p and not p.startswith(LABEL))}
    return ROUTER if all(w.split(" ")[0] in plain for w in wrong) else None


@moe_check("moe.gradients_equal_one_process")
def gradients_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Router and expert gradients (whole: summed over ranks where plain, full_tensor() where sharded) equal one
    process's on the whole batch, and so does the gradient of each rank's tokens (what reaches the layers before)."""
    for counts, reports in _runs(world, impl):
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            _check_close(found["grads"], impl, f"tokens per rank {list(counts)}, rank {rank}: gradients ",
                         changed or functools.partial(_router_only, found["placements"]))
            _check_close({"of this rank's tokens": found["tokens_grad"]}, impl,
                         f"tokens per rank {list(counts)}, rank {rank}: the gradient ", changed or TOKENS)


@moe_check("moe.trains_like_one_process")
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """After one SGD and one Adam step every parameter equals one process's, and every replicated parameter
    (plain, or a DTensor sharded nowhere) is bit-identical on every rank."""
    for counts, reports in _runs(world, impl):
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            _check_close(found["steps"], impl, f"tokens per rank {list(counts)}, rank {rank}: after steps ",
                         changed)
        for name, digest in reports[0]["replicated_digests"].items():
            apart = [r for r, f in enumerate(reports) if f["replicated_digests"].get(name) != digest]
            assert not apart, (
                f"tokens per rank {list(counts)}: replicated {name} differs from rank 0's on rank(s) {apart} "
                "after steps"
            )


@moe_check("moe.experts_sharded_over_ep")
def experts_sharded_over_ep(world: WorldLike, impl: Implementation) -> None:
    """With 2+ ranks some parameter is sharded over the mesh (a DTensor, or rank-local rows), each DTensor shard is
    the chunk its placement says, each rank-local row one of the unsharded layer's, every one held once, and
    sharding kept every weight."""
    _counts, reports = _runs(world, impl)[0]
    found = reports[0]
    problems = sorted({problem for f in reports for problem in f["local_problems"]})
    assert not problems, f"sharding changed the layer's weights: the rank-local rows of {'; '.join(problems)}"
    _check_close(found["start"], impl, "sharding changed the layer's weights: ")
    wrong = sorted({name for f in reports for name in f["chunks_wrong"]})
    assert not wrong, f"local shards that are not their placement's chunk: {', '.join(wrong)}"
    if world.size > 1:
        sharded = [n for n, p in found["placements"].items() if p != "plain"]
        if not sharded:
            raise AssertionError(f"nothing is sharded over the {world.size}-rank mesh: {found['placements']}")
    elif not found["placements"]:
        raise NotApplicable("the layer has no parameters")


def prepare(world: WorldLike, impl: Implementation, notes: list[str]) -> Implementation:
    """Note how the target places the layer's parameters in this world (the report's "expert placements")."""
    found = world.run(ranks.placements, impl)[0]
    if isinstance(found, dict) and world.size > 1 and EXPERTS % world.size == 0:
        shown = ", ".join(f"{n} {p}" for n, p in found.items())
        notes.append(f"moe placements in a world of {world.size}: {shown}")
    return impl
