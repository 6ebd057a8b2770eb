"""Conformance checks of expert parallelism: a mixture-of-experts layer under ``--moe-fn`` against one process.

Each check runs scenarios through :func:`~nemo_dist.conformance.suites.moe.ranks.run`
(:class:`Scenario`: tokens per rank, experts the router is steered away
from, a composition's layout). Every world of 2 or more runs, in each
layout and before anything drawn, the edge cases that hang or break real
expert parallelism (:func:`edge_scenarios`): a rank with no tokens, which
sends nothing; every token on one rank; where the layer's routing can be
steered (the suite's own layer), a rank with tokens whose experts receive
no (token, expert) pair, and every pair sent to one rank. Hypothesis then
draws more (token counts 0-6 a rank, steered expert sets, layouts) and
shrinks a failure; the checks share each scenario's run. Tolerances: the
suite's layer is float64 throughout, and an expert-parallel layer adds the
same products in another order than one process, so outputs, losses,
gradients and parameters after steps are held to 1e-10 relative to
``max(1, max |expected|)``, or to the rounding of a declared
``--moe-compute-dtype`` (:func:`~nemo_dist.conformance.suites.moe.target.tolerance`);
replicated parameters and replicated shards after steps are compared by
their bytes across ranks. A failure names a likely cause only where its
scenario's re-run proves one (:mod:`~nemo_dist.conformance.suites.moe.causes`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nemo_dist.conformance.engine.deadlines import StepAborted
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, WorldRule, check, failure
from nemo_dist.conformance.suites.moe import ranks
from nemo_dist.conformance.suites.moe.causes import forward_cause, gradient_cause
from nemo_dist.conformance.suites.moe.messages import Probe, RunReport
from nemo_dist.conformance.suites.moe.target import (
    Layout,
    batches,
    build_layer,
    composed,
    describe_layout,
    layouts,
    tolerance,
    tp_size,
)

__all__ = [
    "SHARDING_CHANGED",
    "Scenario",
    "drawn_examples",
    "edge_scenarios",
    "experts_sharded_over_ep",
    "forward_equals_one_process",
    "gradients_equal_one_process",
    "prepare",
    "trains_like_one_process",
]

#: Tokens per rank of the first fixed scenario (the first W entries in a world of W): rank 0 has none.
NO_TOKENS_ON_RANK_0 = (0, 5, 3, 1)
#: Tokens per rank of the scenario a diagnosis falls back on, routed freely: every rank's go to its own experts
#: and to others'.
MIXED = (4, 3, 5, 2)
STEPS = (("sgd", 1), ("adam", 1))
#: Experts of the suite's layer: a world whose size does not divide them cannot hold whole experts per rank.
EXPERTS = 12

EXPERTS_SPLIT = WorldRule(
    lambda size: EXPERTS % size == 0, f"the suite's {EXPERTS} experts do not split over {{size}} ranks"
)

#: The cause every later difference has when sharding already changed the layer's weights (proven by comparing the
#: sharded layer's weights, whole, with the unsharded layer's before any step).
SHARDING_CHANGED = (
    "sharding changed the layer's weights (moe.experts_sharded_over_ep says which): every later difference follows "
    "from that"
)


@dataclass(frozen=True)
class Scenario:
    """One run of the layer: ``counts[b]`` tokens in batch b (rank b's, or with tensor parallelism the tp group
    b's), the router steered off the ``muted`` experts, in a composition's ``layout`` (None: the 1-D ep mesh)."""

    counts: tuple[int, ...]
    muted: tuple[int, ...] = ()
    layout: Layout = None

    def seed(self) -> int:
        """The seed the layer and the tokens are made from."""
        return 7 + sum(self.counts) + 31 * len(self.muted)

    def describe(self, reports: list[RunReport] | None = None) -> str:
        """The layout, ``tokens per rank [...]``, the muted experts, and the pairs each rank received where the
        ranks know."""
        text = "" if self.layout is None else f"{describe_layout(self.layout)}, "
        text += f"tokens per {'tp group' if tp_size(self.layout) > 1 else 'rank'} {list(self.counts)}"
        if self.muted:
            text += f", router steered off experts {list(self.muted)}"
        pairs = [f.received_pairs for f in reports or []]
        if pairs and all(p is not None for p in pairs):
            text += f" (pairs received per rank {pairs})"
        return text


@dataclass(frozen=True)
class Placed:
    """How the target lays the layer out in one world and layout: every rank's probe
    (:func:`~.ranks.placements`), what sharding did to the weights included."""

    probes: list[Probe]

    @property
    def placements(self) -> list[dict[str, str] | str]:
        """Per rank, how each parameter is held (or the error the target raised)."""
        return [f.placements for f in self.probes]

    @property
    def held(self) -> list[list[int] | None]:
        """Per rank, the experts it holds (None where nothing says)."""
        return [f.held for f in self.probes]

    @property
    def routing(self) -> tuple[int, int] | None:
        """``(num_experts, top_k)`` of a layer whose routing the suite can steer, else None."""
        return self.probes[0].routing


_PLACED: dict[tuple[int, Implementation, Layout], Placed] = {}
_EXPERTS: dict[Implementation, int] = {}
_RUNS: dict[tuple[int, Implementation, Scenario], list[RunReport] | BaseException] = {}
_DIAGNOSES: dict[tuple[int, Implementation, Scenario], list[dict[str, Any]]] = {}


def world_layouts(world: WorldLike, impl: Implementation) -> list[Layout]:
    """The layouts this world runs: the 1-D ep mesh, or every layout of a composition (whose experts the layer,
    built here once, says)."""
    if not composed(impl):
        return [None]
    if impl not in _EXPERTS:
        _EXPERTS[impl] = int(getattr(build_layer(impl, 0), "num_experts", EXPERTS))
    return layouts(impl, world.size, _EXPERTS[impl])


def _placed(world: WorldLike, impl: Implementation, layout: Layout) -> Placed:
    key = (world.size, impl, layout)
    if key not in _PLACED:
        _PLACED[key] = Placed(world.run(ranks.placements, impl, layout))
    return _PLACED[key]


def _steering(placed: Placed) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where the routing can be steered and each rank's experts are known: the experts to mute so that the last
    rank receives no pair (its own), and so that every pair goes to rank 0 (all but rank 0's); ``()`` where that
    cannot be done (the layer's routing is not steerable, or too few experts would be left)."""
    if placed.routing is None or len(placed.held) < 2 or any(h is None for h in placed.held):
        return (), ()
    experts, top_k = placed.routing
    last, first = set(placed.held[-1] or ()), set(placed.held[0] or ())
    avoid_last = tuple(sorted(last)) if last and experts - len(last) >= top_k else ()
    only_first = tuple(e for e in range(experts) if e not in first) if len(first) >= top_k else ()
    return avoid_last, only_first


def edge_scenarios(world: WorldLike, impl: Implementation) -> list[Scenario]:
    """The scenarios every world runs first, in each layout. With 2+ batches (ranks, or tp groups): batch 0 empty
    (so its ranks send nothing) while the last rank, which has tokens, receives no pair; then every token in the
    last batch and every pair sent to rank 0 (so every other rank receives nothing). One batch: 5 tokens, and
    where the routing can be steered every pair sent to rank 0. Where it cannot, the token counts alone are
    kept."""
    found: list[Scenario] = []
    for layout in world_layouts(world, impl):
        held = batches(layout, world.size)
        avoid_last, only_first = _steering(_placed(world, impl, layout)) if world.size > 1 else ((), ())
        if held == 1:
            found.extend(dict.fromkeys([Scenario((5,), (), layout), Scenario((5,), only_first, layout)]))
            continue
        found.append(Scenario(NO_TOKENS_ON_RANK_0[:held], avoid_last, layout))
        found.append(Scenario((0,) * (held - 1) + (4,), only_first, layout))
    return found


def _drawn(world: WorldLike, impl: Implementation) -> st.SearchStrategy[Scenario]:
    """Scenarios hypothesis draws: a layout, 0-6 tokens a batch, at least one in all (a world of no token anywhere
    has no loss to take a gradient of); where steerable, no expert muted, a rank's experts muted, all but a rank's
    muted, or any set that leaves ``top_k``."""

    def in_layout(layout: Layout) -> st.SearchStrategy[Scenario]:
        held = batches(layout, world.size)
        counts = st.lists(st.integers(0, 6), min_size=held, max_size=held).filter(any).map(tuple)
        placed = _placed(world, impl, layout)
        if placed.routing is None:
            return st.builds(Scenario, counts, st.just(()), st.just(layout))
        experts, top_k = placed.routing
        blocks = [tuple(sorted(set(h))) for h in placed.held if h]
        blocks += [tuple(e for e in range(experts) if e not in b) for b in blocks]
        choices: list[st.SearchStrategy[tuple[int, ...]]] = [st.just(())]
        if blocks := [b for b in blocks if b and experts - len(b) >= top_k]:
            choices.append(st.sampled_from(blocks))
        choices.append(st.sets(st.integers(0, experts - 1), max_size=experts - top_k).map(lambda m: tuple(sorted(m))))
        return st.builds(Scenario, counts, st.one_of(*choices), st.just(layout))

    return st.one_of(*(in_layout(layout) for layout in world_layouts(world, impl)))


def _run(world: WorldLike, impl: Implementation, scenario: Scenario, diagnose: bool = False) -> list[RunReport]:
    """Every rank's :func:`~.ranks.run` of ``scenario`` (with ``diagnose``: its diagnosis values too)."""
    return world.run(ranks.run, impl, list(scenario.counts), scenario.seed(), STEPS, list(scenario.muted), diagnose,
                     layout=scenario.layout)


def _reports(world: WorldLike, impl: Implementation, scenario: Scenario) -> list[RunReport]:
    """Every rank's report of ``scenario`` in this world (run once per world size and target, shared by the checks;
    a run that raised or hung raises the same for every check)."""
    key = (world.size, impl, scenario)
    if key not in _RUNS:
        try:
            _RUNS[key] = _run(world, impl, scenario)
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


Judge = Callable[[Scenario, list[RunReport]], None]


Diagnose = Callable[[Sequence[dict[str, Any]], float, dict[str, int]], "str | None"]


def _each_scenario(world: WorldLike, impl: Implementation, judge: Judge, diagnose: Diagnose) -> None:
    """``judge`` every edge scenario's reports, then drawn ones' (hypothesis shrinks a failing one). A failure with
    no cause of its own gets the one ``diagnose`` proves from its scenario re-run with ``diagnose`` (none where
    nothing is proven)."""

    @settings(max_examples=drawn_examples())
    @given(scenario=_drawn(world, impl))
    def prop(scenario: Scenario) -> None:
        try:
            judge(scenario, _reports(world, impl, scenario))
        except AssertionError as exc:
            exc.moe_scenario = scenario  # type: ignore[attr-defined]
            raise

    for scenario in reversed(edge_scenarios(world, impl)):
        prop = example(scenario=scenario)(prop)
    try:
        prop()
    except AssertionError as exc:
        failed = getattr(exc, "moe_scenario", None)
        if not getattr(exc, "likely_cause", "") and failed is not None:
            found = _proven(world, impl, failed, diagnose)
            if found:
                exc.likely_cause = found  # type: ignore[attr-defined]
        raise


def _proven(world: WorldLike, impl: Implementation, failed: Scenario, diagnose: Diagnose) -> str:
    """The cause ``diagnose`` proves from ``failed``'s re-run; where that scenario fits several causes (two bugs
    that give the same values there: a rank whose tokens reach no expert of its own cannot tell a detached
    dispatch from a gather that keeps its own experts' part), the first of :data:`MIXED` (every rank's tokens
    routed freely) and the layout's other edge scenarios that tells them apart; "" where nothing is proven."""
    mixed = Scenario(MIXED[: batches(failed.layout, world.size)], (), failed.layout)
    others = [s for s in (mixed, *edge_scenarios(world, impl)) if s.layout == failed.layout and s != failed]
    for scenario in (failed, *others):
        try:
            found = diagnose(_diagnosis(world, impl, scenario), tolerance(impl), _sizes(world.size, scenario.layout))
        except (Exception, StepAborted):  # a diagnosis that breaks proves nothing; the failure stands as it is
            return ""
        if found is not None:
            return found
    return ""


def _sizes(size: int, layout: Layout) -> dict[str, int]:
    """The sizes an exact factor is named against: the world (W), ep (the world on the 1-D mesh), edp, and with
    tensor parallelism tp and the data-parallel size dp (W / tp)."""
    if layout is None:
        return {"W": size, "ep": size}
    found = {"W": size, "ep": layout[1], "edp": layout[0]}
    if len(layout) > 2:
        found.update(tp=tp_size(layout), dp=batches(layout, size))
    return found


def _diagnosis(world: WorldLike, impl: Implementation, scenario: Scenario) -> list[dict[str, Any]]:
    """Every rank's diagnosis values of ``scenario`` (:func:`~.ranks.run` with ``diagnose``), run once per world
    size, target and scenario."""
    key = (world.size, impl, scenario)
    if key not in _DIAGNOSES:
        _DIAGNOSES[key] = [f.values or {} for f in _run(world, impl, scenario, diagnose=True)]
    return _DIAGNOSES[key]


def _off(differences: dict[str, float | None], allowed: float) -> dict[str, float]:
    """What is off by more than ``allowed``, with its difference (inf for a wrong shape)."""
    return {name: float("inf") if d is None else d for name, d in differences.items() if d is None or d > allowed}


def _close_on_every_rank(per_rank: Sequence[dict[str, float | None]], impl: Implementation, where: str,
                         cause: str | None = None) -> None:
    """Fail naming each tensor that is off, by how much and on which ranks (``where`` first), with ``cause`` where
    given (else the check's diagnosis may prove one: :func:`_each_scenario`)."""
    allowed = tolerance(impl)
    wrong: dict[str, list[tuple[int, float]]] = {}
    for rank, differences in enumerate(per_rank):
        for name, d in _off(differences, allowed).items():
            wrong.setdefault(name, []).append((rank, d))
    if not wrong:
        return
    parts = []
    for name, found in wrong.items():
        largest = max(d for _, d in found)
        ranks = ", ".join(str(r) for r, _ in found)
        parts.append(f"{name} " + ("of the wrong shape" if largest == float("inf") else f"off by {largest:.3g}")
                     + f" on rank{'s' if len(found) > 1 else ''} {ranks}")
    message = f"{where}{'; '.join(parts)} (tolerance {allowed:.3g})"
    raise failure(message, cause) if cause else AssertionError(message)


def moe_check(name: str, *, rule: WorldRule | None = EXPERTS_SPLIT) -> Callable[[Callable[..., None]], Any]:
    """Register check ``moe.NAME`` (component ``moe``); a failure names a cause only where one is proven."""

    def register(run: Callable[..., None]) -> Any:
        return check(name, tier="core", component="moe", rule=rule)(run)

    return register


def _changed(reports: list[RunReport], impl: Implementation) -> str | None:
    """The sharding check's cause when sharding already changed the weights on some rank (every later difference
    follows from that), else None."""
    changed = any(f.local_problems or _off(f.start, tolerance(impl)) for f in reports)
    return SHARDING_CHANGED if changed else None


@moe_check("moe.forward_equals_one_process")
def forward_equals_one_process(world: WorldLike, impl: Implementation) -> None:
    """Each rank's output and auxiliary load-balance loss equal one process's on that rank's tokens."""

    def judge(scenario: Scenario, reports: list[RunReport]) -> None:
        changed = _changed(reports, impl)
        where = f"{scenario.describe(reports)}: "
        _close_on_every_rank([{"output": f.out} for f in reports], impl, where, changed)
        _close_on_every_rank([{"aux loss": f.aux} for f in reports if f.has_aux], impl, where, changed)

    _each_scenario(world, impl, judge, forward_cause)


@moe_check("moe.gradients_equal_one_process")
def gradients_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Router and expert gradients (whole: summed over ranks where plain, full_tensor() where sharded, zeros where a
    shard got none) equal one process's on the whole batch, and so does the gradient of each rank's tokens (what
    reaches the layers before)."""

    def judge(scenario: Scenario, reports: list[RunReport]) -> None:
        changed = _changed(reports, impl)
        where = f"{scenario.describe(reports)}: "
        _close_on_every_rank([f.grads for f in reports], impl, f"{where}gradients of ", changed)
        _close_on_every_rank([{"each rank's tokens": f.tokens_grad} for f in reports], impl,
                             f"{where}the gradient of ", changed)

    _each_scenario(world, impl, judge, gradient_cause)


@moe_check("moe.trains_like_one_process")
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """After one SGD and one Adam step every parameter equals one process's, every replicated parameter (plain, or
    a DTensor sharded nowhere) is bit-identical on every rank, and every shard is bit-identical on the ranks that
    hold the same part (replicas over expert-data parallelism)."""

    def judge(scenario: Scenario, reports: list[RunReport]) -> None:
        changed = _changed(reports, impl)
        _close_on_every_rank([f.steps for f in reports], impl, f"{scenario.describe(reports)}: after steps ",
                             changed)
        for name, digest in reports[0].replicated_digests.items():
            apart = [r for r, f in enumerate(reports) if f.replicated_digests.get(name) != digest]
            assert not apart, (
                f"{scenario.describe(reports)}: replicated {name} differs from rank 0's on rank(s) {apart} after steps"
            )
        holders: dict[tuple[str, Any], list[tuple[int, str]]] = {}
        for rank, found in enumerate(reports):
            for name, (part, digest) in found.shard_digests.items():
                holders.setdefault((name, part), []).append((rank, digest))
        for (name, _part), held in holders.items():
            apart = [r for r, d in held if d != held[0][1]]
            assert not apart, (
                f"{scenario.describe(reports)}: {name}'s shard on rank(s) {apart} differs from its replica on rank "
                f"{held[0][0]} after steps (the replicas of an expert shard are never reduced alike)"
            )

    # Steps follow from the gradients: where the gradients' difference is proven, so is the steps'.
    _each_scenario(world, impl, judge, gradient_cause)


@moe_check("moe.experts_sharded_over_ep")
def experts_sharded_over_ep(world: WorldLike, impl: Implementation) -> None:
    """With 2+ ranks some parameter is sharded over the mesh (a DTensor, or rank-local rows), each DTensor shard is
    the chunk its placements give the rank's coordinate on its own mesh, each rank-local row one of the unsharded
    layer's, every one held as often as the layout replicates it, and sharding kept every weight; in every layout."""
    for layout in world_layouts(world, impl):
        reports = _placed(world, impl, layout).probes
        where = "" if layout is None else f"{describe_layout(layout)}: "
        found = reports[0]
        if isinstance(found.placements, str):
            raise AssertionError(f"{where}the target raised applying expert parallelism: {found.placements}")
        problems = sorted({problem for f in reports for problem in f.local_problems})
        assert not problems, (
            f"{where}sharding changed the layer's weights: the rank-local rows of {'; '.join(problems)}"
        )
        _close_on_every_rank([found.start], impl, f"{where}sharding changed the layer's weights: ")
        wrong = sorted({name for f in reports for name in f.chunks_wrong})
        assert not wrong, f"{where}local shards that are not their placement's chunk: {', '.join(wrong)}"
        expert_groups = world.size if layout is None else layout[1]
        if expert_groups > 1:
            sharded = [n for n, p in found.placements.items() if p != "plain"]
            if not sharded:
                raise AssertionError(f"{where}nothing is sharded over the {expert_groups}-rank ep mesh: "
                                     f"{found.placements}")
        elif not found.placements:
            raise NotApplicable("the layer has no parameters")


def prepare(world: WorldLike, impl: Implementation, notes: list[str]) -> Implementation:
    """Note how the target places the layer's parameters in this world, in each layout (the report's "expert
    placements")."""
    if world.size < 2 or EXPERTS % world.size:
        return impl
    for layout in world_layouts(world, impl):
        found = _placed(world, impl, layout).placements[0]
        if isinstance(found, dict):
            shown = ", ".join(f"{n} {p}" for n, p in found.items())
            where = "" if layout is None else f" ({describe_layout(layout)})"
            notes.append(f"moe placements in a world of {world.size}{where}: {shown}")
    return impl
