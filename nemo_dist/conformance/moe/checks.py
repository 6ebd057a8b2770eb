"""Conformance checks of expert parallelism: a mixture-of-experts layer under ``--moe-fn`` against one process.

Each check runs scenarios through :func:`~nemo_dist.conformance.moe.ranks.run`
(:class:`Scenario`: tokens per rank, and experts the router is steered away
from). Every world of 2 or more runs, before anything drawn, the edge cases
that hang or break real expert parallelism: a rank with no tokens, which
sends nothing; every token on one rank; where the layer's routing can be
steered (the suite's own layer), a rank whose experts receive no (token,
expert) pair, and every pair sent to one rank. Hypothesis then draws more
(token counts 0-6 a rank, steered expert sets) and shrinks a failure; the
checks share each scenario's run. Tolerances: the suite's layer is float64
throughout, and an expert-parallel layer adds the same products in another
order than one process, so outputs, losses, gradients and parameters after
steps are held to 1e-10 relative to ``max(1, max |expected|)``, or to the
rounding of a declared ``--moe-compute-dtype``
(:func:`~nemo_dist.conformance.moe.target.tolerance`); replicated parameters
after steps are compared by their bytes across ranks. A float64 run whose
every difference is within float32's rounding names that as its likely
cause, not a bug of the dispatch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nemo_dist.conformance.errors import NotApplicable
from nemo_dist.conformance.implementation import Implementation
from nemo_dist.conformance.moe import ranks
from nemo_dist.conformance.moe.local import LABEL
from nemo_dist.conformance.moe.target import dtype_tolerance, tolerance
from nemo_dist.conformance.registry import WorldLike, WorldRule, check, with_likely_cause

__all__ = [
    "CAUSES",
    "Scenario",
    "drawn_examples",
    "edge_scenarios",
    "experts_sharded_over_ep",
    "forward_equals_one_process",
    "gradients_equal_one_process",
    "prepare",
    "trains_like_one_process",
]

#: Tokens per rank of the fixed scenarios (the first W entries in a world of W).
NO_TOKENS_ON_RANK_1 = (5, 0, 3, 1)
STEERED_COUNTS = ((2, 6, 1, 4), (3, 2, 4, 1))
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

@dataclass(frozen=True)
class Scenario:
    """One run of the layer: ``counts[r]`` tokens on rank r, the router steered off the ``muted`` experts."""

    counts: tuple[int, ...]
    muted: tuple[int, ...] = ()

    def seed(self) -> int:
        """The seed the layer and the tokens are made from."""
        return 7 + sum(self.counts) + 31 * len(self.muted)

    def describe(self, reports: list[dict[str, Any]] | None = None) -> str:
        """``tokens per rank [...]``, the muted experts, and the pairs each rank received where the ranks know."""
        text = f"tokens per rank {list(self.counts)}"
        if self.muted:
            text += f", router steered off experts {list(self.muted)}"
        pairs = [f.get("received_pairs") for f in reports or []]
        if pairs and all(p is not None for p in pairs):
            text += f" (pairs received per rank {pairs})"
        return text


@dataclass(frozen=True)
class Layout:
    """How the target lays the layer out in one world: per rank, its placements and the experts it holds."""

    placements: list[dict[str, str] | str]
    held: list[list[int] | None]
    routing: tuple[int, int] | None


_LAYOUTS: dict[tuple[int, Implementation], Layout] = {}
_RUNS: dict[tuple[int, Implementation, Scenario], list[dict[str, Any]] | BaseException] = {}


def _layout(world: WorldLike, impl: Implementation) -> Layout:
    key = (world.size, impl)
    if key not in _LAYOUTS:
        found = world.run(ranks.placements, impl)
        _LAYOUTS[key] = Layout([f["placements"] for f in found], [f["held"] for f in found], found[0]["routing"])
    return _LAYOUTS[key]


def _steered(layout: Layout, size: int) -> list[Scenario]:
    """Where the routing can be steered and each rank's experts are known: rank W-1 receives no pair (its experts
    muted), and every pair goes to rank 0 (every other expert muted)."""
    if layout.routing is None or size < 2 or any(h is None for h in layout.held):
        return []
    experts, top_k = layout.routing
    last, first = layout.held[-1] or [], layout.held[0] or []
    found = []
    if last and experts - len(set(last)) >= top_k:
        found.append(Scenario(STEERED_COUNTS[0][:size], tuple(sorted(set(last)))))
    if len(set(first)) >= top_k:
        found.append(Scenario(STEERED_COUNTS[1][:size], tuple(e for e in range(experts) if e not in first)))
    return found


def edge_scenarios(world: WorldLike, impl: Implementation) -> list[Scenario]:
    """The scenarios every world runs first: rank 1 with no tokens (so it sends nothing), every token on the last
    rank, and the :func:`_steered` ones."""
    size = world.size
    fixed = [Scenario(NO_TOKENS_ON_RANK_1[:size])]
    if size > 1:
        fixed.append(Scenario((0,) * (size - 1) + (4,)))
    return fixed + _steered(_layout(world, impl), size)


def _drawn(layout: Layout, size: int) -> st.SearchStrategy[Scenario]:
    """Scenarios hypothesis draws: 0-6 tokens a rank, at least one in all (a batch of no token anywhere has no loss
    to take a gradient of); where steerable, no expert muted, a rank's experts muted, all but a rank's muted, or any
    set that leaves ``top_k``."""
    counts = st.lists(st.integers(0, 6), min_size=size, max_size=size).filter(any).map(tuple)
    if layout.routing is None:
        return st.builds(Scenario, counts)
    experts, top_k = layout.routing
    blocks = [tuple(sorted(set(h))) for h in layout.held if h]
    blocks += [tuple(e for e in range(experts) if e not in b) for b in blocks]
    choices: list[st.SearchStrategy[tuple[int, ...]]] = [st.just(())]
    if blocks := [b for b in blocks if b and experts - len(b) >= top_k]:
        choices.append(st.sampled_from(blocks))
    choices.append(st.sets(st.integers(0, experts - 1), max_size=experts - top_k).map(lambda m: tuple(sorted(m))))
    return st.builds(Scenario, counts, st.one_of(*choices))


def _reports(world: WorldLike, impl: Implementation, scenario: Scenario) -> list[dict[str, Any]]:
    """Every rank's report of ``scenario`` in this world (run once per world size and target, shared by the checks;
    a run that raised or hung raises the same for every check)."""
    key = (world.size, impl, scenario)
    if key not in _RUNS:
        try:
            _RUNS[key] = world.run(ranks.run, impl, list(scenario.counts), scenario.seed(), STEPS, list(scenario.muted))
        except BaseException as exc:
            _RUNS[key] = exc
            raise
    found = _RUNS[key]
    if isinstance(found, BaseException):
        raise found
    return found


def drawn_examples() -> int:
    """How many scenarios hypothesis draws in a world beyond the edge cases: a tenth of ``max_examples``, at least 1
    (each costs a forward, backward and two steps of both layers: about 0.3 s in a world of 4 on 2 cores)."""
    return max(1, settings().max_examples // 10)


Judge = Callable[[Scenario, list[dict[str, Any]]], None]


def _each_scenario(world: WorldLike, impl: Implementation, judge: Judge) -> None:
    """``judge`` every edge scenario's reports, then drawn ones' (hypothesis shrinks a failing one)."""

    @settings(max_examples=drawn_examples())
    @given(scenario=_drawn(_layout(world, impl), world.size))
    def prop(scenario: Scenario) -> None:
        judge(scenario, _reports(world, impl, scenario))

    for scenario in reversed(edge_scenarios(world, impl)):
        prop = example(scenario=scenario)(prop)
    prop()


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

    def judge(scenario: Scenario, reports: list[dict[str, Any]]) -> None:
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            where = f"{scenario.describe(reports)}, rank {rank}: "
            _check_close({"output": found["out"]}, impl, where, changed)
            if found["has_aux"]:
                _check_close({"aux loss": found["aux"]}, impl, where, changed or AUX)

    _each_scenario(world, impl, judge)


def _router_only(placements: dict[str, str], wrong: list[str]) -> str | None:
    """:data:`ROUTER` when every wrong gradient is a replicated parameter's (plain, or sharded nowhere)."""
    plain = {n for n, p in placements.items() if p == "plain" or ("Shard" not in p and not p.startswith(LABEL))}
    return ROUTER if all(w.split(" ")[0] in plain for w in wrong) else None


@moe_check("moe.gradients_equal_one_process")
def gradients_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Router and expert gradients (whole: summed over ranks where plain, full_tensor() where sharded, zeros where a
    shard got none) equal one process's on the whole batch, and so does the gradient of each rank's tokens (what
    reaches the layers before)."""

    def judge(scenario: Scenario, reports: list[dict[str, Any]]) -> None:
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            where = f"{scenario.describe(reports)}, rank {rank}: "
            _check_close(found["grads"], impl, f"{where}gradients ",
                         changed or functools.partial(_router_only, found["placements"]))
            _check_close({"of this rank's tokens": found["tokens_grad"]}, impl, f"{where}the gradient ",
                         changed or TOKENS)

    _each_scenario(world, impl, judge)


@moe_check("moe.trains_like_one_process")
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """After one SGD and one Adam step every parameter equals one process's, and every replicated parameter
    (plain, or a DTensor sharded nowhere) is bit-identical on every rank."""

    def judge(scenario: Scenario, reports: list[dict[str, Any]]) -> None:
        changed = _changed(reports, impl)
        for rank, found in enumerate(reports):
            _check_close(found["steps"], impl, f"{scenario.describe(reports)}, rank {rank}: after steps ", changed)
        for name, digest in reports[0]["replicated_digests"].items():
            apart = [r for r, f in enumerate(reports) if f["replicated_digests"].get(name) != digest]
            assert not apart, (
                f"{scenario.describe(reports)}: replicated {name} differs from rank 0's on rank(s) {apart} after steps"
            )

    _each_scenario(world, impl, judge)


@moe_check("moe.experts_sharded_over_ep")
def experts_sharded_over_ep(world: WorldLike, impl: Implementation) -> None:
    """With 2+ ranks some parameter is sharded over the mesh (a DTensor, or rank-local rows), each DTensor shard is
    the chunk its placements give the rank's coordinate on its own mesh, each rank-local row one of the unsharded
    layer's, every one held once, and sharding kept every weight."""
    reports = _reports(world, impl, edge_scenarios(world, impl)[0])
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
    found = _layout(world, impl).placements[0]
    if isinstance(found, dict) and world.size > 1 and EXPERTS % world.size == 0:
        shown = ", ".join(f"{n} {p}" for n, p in found.items())
        notes.append(f"moe placements in a world of {world.size}: {shown}")
    return impl
