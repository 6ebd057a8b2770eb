"""Run conformance checks against an implementation and collect verdicts.

One :class:`~nemo_dist.conformance.engine.verdicts.Verdict` per check run and world
size (a check that needs no process group runs once, world size 0; a ddp
check runs once per DDP entry point the module defines; the runs are the
registry's :func:`~nemo_dist.conformance.engine.registry.cases`). Checks run in
persistent worlds (one ``nemo_dist.testing.World`` per size, reused by every
check of that size, its steps under adaptive deadlines) or in any
``WorldLike`` a caller provides (the torchrun adapter, a pytest fixture). A
check that crashes or hangs its world fails alone: the harness replaces the
world and the next check gets healthy ranks. Warnings raised inside the
checks are collected into the verdicts, never failures. What a suite needs
besides its checks (a rank-side setup at world start, a step before its
checks) comes from the registry's :data:`~nemo_dist.conformance.engine.registry.SUITES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_dist.conformance.engine import lanes, thread_warnings
from nemo_dist.conformance.engine.deadlines import FLOOR_S, Deadlines, DeadlineWorld, StepAborted, warm_up
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.profile import hypothesis_settings, new_seed, seeded
from nemo_dist.conformance.engine.registry import SUITES, Case, Check, WorldLike, cases, thoroughness
from nemo_dist.conformance.engine.target import SUITE_TARGETS, checked_components, import_components, own_modules
from nemo_dist.conformance.engine.verdicts import Outcome, Report, Verdict, classify

__all__ = ["run_case", "run_check", "run_checks", "run_checks_in", "run_worldless"]

#: Seconds a world's ranks get to start at the least (import torch, join, warm up).
_STARTUP_S = 120.0


def _warning_texts(caught: Sequence[warnings.WarningMessage]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))


@contextmanager
def _quiet_hypothesis() -> Iterator[None]:
    """Keep hypothesis's own printed reports (seeds to reproduce, ...) out of the table."""
    from hypothesis.reporting import with_reporter

    with with_reporter(lambda text: None):
        yield


def run_check(check: Check, world: WorldLike | None, impl: Implementation, *, name: str | None = None) -> Verdict:
    """Run ``check`` once in ``world`` (None for a check that needs none) against ``impl``; return its verdict.

    Never raises for a failing implementation: ``NotSupported`` (raised in the
    parent or on every rank) gives "not supported"; ``NotApplicable``, and a
    world size outside the check's range, "not applicable"; ``unittest.SkipTest``
    (the environment cannot run the check) "skipped"; a step past its
    deadline "hang" with the hung call and every rank's stack; an assertion
    or any other exception (``RankFailure`` included) "fail" with its
    message, the shrunk hypothesis example, any likely cause the check
    attached (``exc.likely_cause``) and the traceback of the code under test
    (each distinct failure so, when hypothesis found several: see
    :func:`~nemo_dist.conformance.engine.verdicts.classify`). ``name`` labels the
    verdict (default ``check.name``). Warnings raised inside are recorded in the verdict.
    Only ``KeyboardInterrupt`` and ``SystemExit`` propagate.
    """
    start = time.perf_counter()
    size = 0 if world is None else world.size
    caught: list[warnings.WarningMessage] = []

    def verdict(outcome: Outcome, message: str = "", **explained: Any) -> Verdict:
        return Verdict(
            name or check.name,
            check.component,
            check.tier,
            size,
            outcome,
            time.perf_counter() - start,
            message,
            warnings=_warning_texts(caught),
            **explained,
        )

    if world is not None and not check.applies_to(size):
        if not check.needs_world:
            return verdict("not applicable", "needs no process group: runs once, outside the worlds")
        if check.rule is not None and not check.rule.fits(size):
            return verdict("not applicable", check.rule.reason.format(size=size))
        if check.max_world == check.min_world:
            limit = f"of {check.min_world} rank" + ("s" if check.min_world > 1 else "")
        else:
            upper = " or more" if check.max_world is None else f"..{check.max_world}"
            limit = f"of {check.min_world}{upper} ranks"
        return verdict("not applicable", f"runs in worlds {limit}")
    try:
        with thread_warnings.recording() as recorded, _quiet_hypothesis():
            try:
                check(world, impl)
            finally:
                caught = list(recorded)
    except BaseException as exc:  # every failure becomes a verdict
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        found = classify(exc)
        return verdict(
            found.outcome,
            found.message,
            example=found.example,
            cause=found.cause,
            traceback=found.traceback,
            findings=found.findings,
            chosen=found.chosen,
        )
    return verdict("pass")


def run_case(case: Case, world: WorldLike | None) -> Verdict:
    """The verdict of one :class:`~nemo_dist.conformance.engine.registry.Case` (``world`` None for world size 0).

    A case whose implementation defines none of the check's entry points is
    "not supported" without running; one checked once in another world of
    the run "not applicable", saying where.
    """
    c = case.check
    if case.impl is None:
        return Verdict(c.name, c.component, c.tier, case.world_size, "not supported", 0.0, case.missing)
    if case.elsewhere:
        return Verdict(case.name, c.component, c.tier, case.world_size, "not applicable", 0.0, case.elsewhere)
    with thoroughness(case):
        return run_check(case.check, world, case.impl, name=case.name)


def run_worldless(
    checks: Sequence[Check],
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None = None,
) -> None:
    """Run, once each and in this process, the checks of ``checks`` that need no world."""
    worldless = cases([c for c in checks if not c.needs_world], impl, ())
    for case in _missing_first(worldless):
        _record(run_case(case, None), verdicts, on_verdict)


def _missing_first(found: list[Case]) -> list[Case]:
    """The cases with no entry point (reported first, as they need no run), then the others in order."""
    return [c for c in found if c.impl is None] + [c for c in found if c.impl is not None]


def _record(verdict: Verdict, verdicts: list[Verdict], on_verdict: Callable[[Verdict], None] | None) -> None:
    verdicts.append(verdict)
    if on_verdict is not None:
        on_verdict(verdict)


def _world_setup(checks: Sequence[Check]) -> Callable[[], None] | None:
    """The rank-side setup of the suites whose world checks are selected (None when none has one)."""
    components = dict.fromkeys(c.component for c in checks if c.needs_world)
    setups = [s.world_setup for s in (SUITES.get(c) for c in components) if s is not None and s.world_setup]
    if not setups:
        return None
    return setups[0] if len(setups) == 1 else functools.partial(_run_each, tuple(setups))


def _preload(checks: Sequence[Check], impl: Implementation, setup: Callable[[], None] | None) -> tuple[str, ...]:
    """The modules the ranks of the world checks import: each check's module (its rank side) and its ``preload``,
    the world setup's module and the modules of this package ``impl`` names (:func:`.target.own_modules`).

    The fork server imports them once and every rank inherits them; a rank importing one itself also compiles
    its bytecode where none is written (``PYTHONDONTWRITEBYTECODE``).
    """
    world = [c for c in checks if c.needs_world]
    if not world:
        return ()
    setup_module = [getattr(setup, "func", setup).__module__] if setup is not None else []
    checked = [*(c.fn.__module__ for c in world), *(m for c in world for m in c.preload)]
    return tuple(dict.fromkeys([*checked, *setup_module, *own_modules(impl)]))


def _run_each(setups: tuple[Callable[[], None], ...]) -> None:
    for setup in setups:
        setup()


def run_checks(
    checks: Sequence[Check],
    impl: Implementation,
    world_sizes: Sequence[int] = (2, 3),
    *,
    backend: str = "gloo",
    tier: str = "all",
    max_examples: int | None = 10,
    timeout: float = 120.0,
    min_deadline: float = FLOOR_S,
    worlds: Callable[[int], WorldLike] | None = None,
    on_verdict: Callable[[Verdict], None] | None = None,
    components: Sequence[str] | None = None,
    seed: int | None = None,
    hypothesis_db: Path | None = None,
) -> Report:
    """Run ``checks`` (already selected): the world-less ones once, the others in a world of each size.

    Each size gets one world, reused by all its checks and closed afterwards:
    a ``nemo_dist.testing.World(size, backend, timeout)`` (the next size's
    ranks start in the background while this size's checks run, building
    their first DDP there when ddp checks are selected), or
    ``worlds(size)`` when given (the caller then owns and closes it). Steps of a World run
    under adaptive deadlines capped by ``timeout`` (see
    :mod:`~nemo_dist.conformance.engine.deadlines`), at least ``min_deadline``
    seconds each (``--min-deadline``); a step past its deadline whose ranks
    are still working gets time up to ``timeout``. Hypothesis runs with
    ``max_examples``, its files under ``hypothesis_db`` (default None: no
    database, caches in a temporary directory; see :func:`hypothesis_settings`)
    and ``seed`` (default: a fresh one), recorded in the report, so a failing
    check run alone with that seed fails the same way.
    ``on_verdict`` is called after each check (progress output);
    ``components`` (default: those ``impl`` names) is recorded in the report.
    Verdicts come in run order: world-less checks, then by world size, then by check.
    Raises ``OptionError`` (a usage error) when a suite's preparation finds
    that the options cannot work (``MissingParameter``: the gather callable's
    first call lacks a parameter); the worlds are closed first.
    """
    start = time.perf_counter()
    verdicts: list[Verdict] = []
    notes: list[str] = []
    deadlines = Deadlines(timeout, min_deadline)
    seed = new_seed() if seed is None else seed
    with hypothesis_settings(max_examples, database=hypothesis_db), seeded(seed), contextlib.ExitStack() as owned:
        run_worldless(checks, impl, verdicts, on_verdict)
        if worlds is None:
            from nemo_dist.testing import World

            setup = _world_setup(checks)
            # A cold start on a loaded machine (bytecode compiled afresh by every rank) can take minutes.
            startup = max(_STARTUP_S, 3 * timeout)
            preload = _preload(checks, impl, setup)
            made = [
                owned.enter_context(
                    World(size, backend, timeout, setup=setup, startup_timeout=startup, preload=preload)
                )
                for size in world_sizes
            ]
        if worlds is not None:
            for size in world_sizes:
                run_checks_in(
                    checks,
                    worlds(size),
                    impl,
                    verdicts,
                    on_verdict,
                    deadlines=deadlines,
                    notes=notes,
                    world_sizes=world_sizes,
                )
        else:
            _run_worlds(
                made, checks, impl, verdicts, on_verdict, deadlines, notes, _lane_count(backend, made), world_sizes
            )
    return Report(
        tuple(verdicts),
        impl,
        backend,
        tier,
        max_examples,
        time.perf_counter() - start,
        tuple(dict.fromkeys(notes)),
        components=tuple(checked_components(impl) if components is None else components),
        seed=seed,
    )


def _lane_count(backend: str, worlds: Sequence[Any]) -> int:
    """Lanes for ``worlds``: side by side on gloo where two cores or more can take them, else one."""
    if backend != "gloo" or len(worlds) < 2 or (os.cpu_count() or 1) < 2:
        return 1
    return lanes.MAX_LANES


def _run_worlds(
    made: list[Any],
    checks: Sequence[Check],
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None,
    deadlines: Deadlines,
    notes: list[str],
    lane_count: int,
    world_sizes: Sequence[int],
) -> None:
    """Run the checks in each World of ``made``, ``lane_count`` lanes side by side; verdicts in world order.

    In each lane, the next world's ranks start (join, warm up) in the background
    while this world's checks run; the first world of every lane starts before
    any lane does (from this thread: see :mod:`~nemo_dist.conformance.engine.lanes`).
    """
    # One lane keeps the given order, so progress lines come as they always did (NCCL, a single core).
    dealt = lanes.deal([w.size for w in made], lane_count) if lane_count > 1 else [list(range(len(made)))]
    applicable = [any(c.applies_to(w.size) for c in checks) for w in made]
    per_world: list[list[Verdict]] = [[] for _ in made]
    per_world_notes: list[list[str]] = [[] for _ in made]
    following = {lane[n]: lane[n + 1] for lane in dealt for n in range(len(lane) - 1)}

    def start_in_background(index: int) -> None:
        if applicable[index]:
            with contextlib.suppress(Exception):  # a failed start is reported by that world's first check
                made[index].start(wait=False)

    def run_world(index: int, emit: Callable[[Verdict], None] | None) -> None:
        if index in following:
            start_in_background(following[index])
        found, found_notes = per_world[index], per_world_notes[index]
        run_checks_in(
            checks, made[index], impl, found, emit, deadlines=deadlines, notes=found_notes, world_sizes=world_sizes
        )
        made[index].close()

    if len(dealt) == 1:
        for index in dealt[0]:
            run_world(index, on_verdict)
    else:
        for lane in dealt:
            start_in_background(lane[0])
        lanes.run_lanes(dealt, run_world, on_verdict, len(made))
    for found, found_notes in zip(per_world, per_world_notes, strict=True):
        verdicts.extend(found)
        notes.extend(found_notes)


def _prepared(world: Any, checks: Sequence[Check], impl: Implementation, notes: list[str]) -> Implementation:
    """Import ``impl`` on every rank of ``world``, then run each selected suite's ``prepare`` step.

    A step that fails leaves ``impl`` as it is: the checks report what goes
    wrong. An ``OptionError`` (a step found that the options cannot work: a
    parameter no option fills, say) propagates: it is a usage error.
    """
    try:
        with thread_warnings.ignoring():  # the checks record what the implementation warns
            warm_up(world, import_components, impl, sorted({c.component for c in checks}))
            for component in dict.fromkeys(c.component for c in checks):
                suite = SUITES.get(component)
                if suite is not None and suite.prepare is not None:
                    impl = suite.prepare(world, impl, notes)
    except OptionError:
        raise
    except (Exception, StepAborted):
        return impl
    return impl


def _not_started(case: Case, error: Exception) -> Verdict:
    """The verdict of a case whose world failed to start: a failure naming the start error, with no run."""
    c = case.check
    if case.impl is None:
        return run_case(case, None)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    message = f"WorldError: the world of {case.world_size} ranks did not start, so this check did not run: {first}"
    return Verdict(case.name, c.component, c.tier, case.world_size, "fail", 0.0, f"{message}\n{error}")


def _refined(case: Case, prepared: Implementation) -> Case:
    """``case`` with what the suites' preparation changed in the implementation (its pinned variant kept)."""
    if case.impl is None:
        return case
    pinned = {t.variant_field: case.impl.value(t.variant_field) for t in SUITE_TARGETS.values() if t.variant_field}
    return dataclasses.replace(case, impl=prepared.replaced(**pinned))


def run_checks_in(
    checks: Sequence[Check],
    world: WorldLike,
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None,
    *,
    deadlines: Deadlines | None = None,
    notes: list[str] | None = None,
    world_sizes: Sequence[int] | None = None,
) -> None:
    """Run each of ``checks`` that needs a world in ``world``, in order, appending verdicts.

    A ``nemo_dist.testing.World`` is started first (so the first check's time
    is its own) and prepared (the implementation imported on every rank, each
    suite's ``prepare`` step); with ``deadlines`` its steps run under them.
    ``world_sizes`` are the run's (default: this world's alone), which says
    where a ``once`` check runs.
    """
    sizes = (world.size,) if world_sizes is None else tuple(world_sizes)
    needing = [c for c in checks if c.needs_world]
    found = _missing_first([case for case in cases(needing, impl, sizes) if case.world_size == world.size])
    target: WorldLike = world
    if any(case.applies and case.impl is not None for case in found):
        start = getattr(world, "start", None)
        if callable(start):
            try:
                start()
            except Exception as exc:  # started once: every case says why, none relaunches the world
                for case in found:
                    verdict = _not_started(case, exc) if case.applies else run_case(case, world)
                    _record(verdict, verdicts, on_verdict)
                return
        if deadlines is not None and callable(getattr(world, "run_with_deadline", None)):
            target = DeadlineWorld(world, deadlines)
        prepared = _prepared(target, checks, impl, [] if notes is None else notes)
        if prepared != impl:
            found = [_refined(case, prepared) for case in found]
    for case in found:
        _record(run_case(case, target), verdicts, on_verdict)
