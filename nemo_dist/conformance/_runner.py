"""Run conformance checks against an implementation and collect verdicts.

One :class:`Verdict` per check run and world size (a check that needs no
process group runs once, world size 0; a ddp check runs once per DDP entry
point the module defines); a :class:`Report` holds them and decides the exit
code. Checks run in persistent worlds (one ``nemo_dist.testing.World`` per
size, reused by every check of that size, its steps under adaptive deadlines)
or in any ``WorldLike`` a caller provides (the torchrun adapter, a pytest
fixture). A check that crashes or hangs its world fails alone: the harness
replaces the world and the next check gets healthy ranks. Warnings raised
inside the checks are collected into the verdicts, never failures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import unittest
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_dist.conformance._deadline import Deadlines, DeadlineWorld, StepAborted, StepHung
from nemo_dist.conformance._impl import Implementation, NotApplicable, NotSupported
from nemo_dist.conformance._registry import Check, WorldLike

__all__ = [
    "TIERS",
    "Outcome",
    "Report",
    "Verdict",
    "checked_components",
    "hypothesis_settings",
    "is_not_supported",
    "run_check",
    "run_checks",
    "run_checks_in",
    "run_worldless",
    "select_checks",
]

Outcome = Literal["pass", "fail", "hang", "not applicable", "not supported", "skipped"]
TierChoice = Literal["core", "extended", "all"]

#: Accepted values of ``tier``.
TIERS: tuple[str, ...] = ("core", "extended", "all")

_PROFILE = "nemo_dist_conformance"
_RESTORE_PROFILE = "nemo_dist_conformance_restore"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check run in one world size (0: the check needs no world).

    ``message`` is the failure (or hang, not-applicable, not-supported, skip)
    text; ``example`` the shrunk hypothesis example ("Failing test case: ...")
    or, for a hang, the call that hung; ``cause`` the likely cause of a
    failure when the evidence names one; ``warnings`` what the check warned
    ("Category: message", each once).
    """

    check: str
    component: str
    tier: str
    world_size: int
    outcome: Outcome
    seconds: float
    message: str = ""
    example: str = ""
    cause: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """Whether the check broke the contract, crashed or hung."""
        return self.outcome in ("fail", "hang")


@dataclass(frozen=True)
class Report:
    """Every verdict of one conformance run, in run order."""

    verdicts: tuple[Verdict, ...]
    impl: Implementation
    backend: str
    tier: str = "all"
    max_examples: int | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The components whose checks ran; the others' modules only served them.
    components: tuple[str, ...] = ("gather", "ddp", "config")

    def count(self, outcome: Outcome) -> int:
        """Number of verdicts with ``outcome``."""
        return sum(v.outcome == outcome for v in self.verdicts)

    def blocking(self, strict: bool = False) -> list[Verdict]:
        """The verdicts that make the run fail.

        Core failures and hangs always; with ``strict``, any failure or hang
        and any "not supported" (a strict run demands the whole contract).
        """
        if strict:
            return [v for v in self.verdicts if v.failed or v.outcome == "not supported"]
        return [v for v in self.verdicts if v.failed and v.tier == "core"]

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing blocks (see :meth:`blocking`), else 1."""
        return 1 if self.blocking(strict) else 0

    def warnings(self) -> dict[str, list[str]]:
        """Each distinct warning raised inside the checks, with the check runs that raised it, in order."""
        seen: dict[str, list[str]] = {}
        for v in self.verdicts:
            where = v.check if v.world_size == 0 else f"{v.check} w{v.world_size}"
            for text in v.warnings:
                seen.setdefault(text, []).append(where)
        return seen

    def with_notes(self, *notes: str) -> Report:
        """This report with ``notes`` appended."""
        return dataclasses.replace(self, notes=(*self.notes, *notes))


def select_checks(
    checks: Iterable[Check],
    impl: Implementation,
    tier: str = "all",
    select: str | None = None,
    components: Iterable[str] | None = None,
) -> list[Check]:
    """The checks of ``tier`` and of the checked components, in the given order.

    ``tier`` is "core", "extended" or "all"; ``select`` keeps only checks whose
    name contains it ("not TEXT": only those whose name does not);
    ``components`` defaults to those ``impl`` names (not ``None``). Raises
    ``ValueError`` for an unknown tier.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}; got {tier!r}")
    wanted = set(checked_components(impl) if components is None else components)
    return [c for c in checks if (tier == "all" or c.tier == tier) and c.component in wanted and _selected(c, select)]


def _selected(check: Check, select: str | None) -> bool:
    if not select:
        return True
    if select.startswith("not "):
        return select[4:].strip() not in check.name
    return select in check.name


def checked_components(impl: Implementation) -> tuple[str, ...]:
    """The components ``impl`` names (a module, or a gather callable), in the order gather, ddp, config."""
    named = {"gather": impl.gather_named, "ddp": impl.ddp is not None, "config": impl.config is not None}
    return tuple(c for c in ("gather", "ddp", "config") if named[c])


@contextmanager
def hypothesis_settings(
    max_examples: int | None, *, derandomize: bool = False, database: bool = False
) -> Iterator[None]:
    """Run the body under conformance hypothesis settings, then restore the previous ones.

    No example database (unless ``database``: pytest keeps its own), no
    deadline, no ``too_slow`` health check, no ``explain`` phase;
    ``max_examples`` when given (else the active profile's). ``derandomize``
    makes every process draw the same examples (torchrun mode).
    """
    from hypothesis import HealthCheck, Phase, settings

    previous = settings.default
    assert previous is not None
    changes: dict[str, object] = {
        "deadline": None,
        "suppress_health_check": [*previous.suppress_health_check, HealthCheck.too_slow],
    }
    if not database:
        changes["database"] = None
    if max_examples is not None:
        changes["max_examples"] = max_examples
    # "explain" replays examples to list the lines only failing cases ran:
    # noise in a verdict table, extra time, and one more thing that could
    # differ between ranks under torchrun.
    changes["phases"] = [p for p in previous.phases if p is not Phase.explain]
    if derandomize:
        changes["derandomize"] = True
    settings.register_profile(_PROFILE, previous, **changes)
    settings.load_profile(_PROFILE)
    try:
        yield
    finally:
        settings.register_profile(_RESTORE_PROFILE, previous)
        settings.load_profile(_RESTORE_PROFILE)


def is_not_supported(exc: BaseException) -> bool:
    """Whether ``exc`` says "not supported": a ``NotSupported``, or every rank raising one."""
    return _raised_everywhere(exc, NotSupported)


def _is_not_applicable(exc: BaseException) -> bool:
    return _raised_everywhere(exc, NotApplicable)


def _raised_everywhere(exc: BaseException, kind: type[Exception]) -> bool:
    if isinstance(exc, kind):
        return True
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return all(
            isinstance(text, str) and f"rank {rank} raised {kind.__name__}:" in text
            for rank, text in failures.items()
        )
    return False


def _reason(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values())).splitlines()[0]
        ranks = ", ".join(str(r) for r in failures)
        return f"{first.split('raised ', 1)[-1]} (rank {ranks})"
    return _message(exc)


def _example(exc: BaseException) -> str:
    notes = [str(n) for n in getattr(exc, "__notes__", ()) or ()]
    return "\n".join(notes).strip()


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


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
    message, the shrunk hypothesis example and any likely cause the check
    attached (``exc.likely_cause``). ``name`` labels the verdict (default
    ``check.name``). Warnings raised inside are recorded in the verdict.
    Only ``KeyboardInterrupt`` and ``SystemExit`` propagate.
    """
    start = time.perf_counter()
    size = 0 if world is None else world.size
    caught: list[warnings.WarningMessage] = []

    def verdict(outcome: Outcome, message: str = "", example: str = "", cause: str = "") -> Verdict:
        return Verdict(
            name or check.name,
            check.component,
            check.tier,
            size,
            outcome,
            time.perf_counter() - start,
            message,
            example,
            cause,
            _warning_texts(caught),
        )

    if world is not None and not check.applies_to(size):
        if not check.needs_world:
            return verdict("not applicable", "needs no process group: runs once, outside the worlds")
        if check.max_world == check.min_world:
            limit = f"of {check.min_world} rank" + ("s" if check.min_world > 1 else "")
        else:
            upper = " or more" if check.max_world is None else f"..{check.max_world}"
            limit = f"of {check.min_world}{upper} ranks"
        return verdict("not applicable", f"runs in worlds {limit}")
    try:
        with warnings.catch_warnings(record=True) as recorded, _quiet_hypothesis():
            warnings.simplefilter("always")
            try:
                check(world, impl)
            finally:
                caught = list(recorded)
    except StepHung as hung:
        return verdict("hang", f"{hung.deadline_note}\n{hung}", f"Hung step: {hung.call}")
    except StepAborted as broke:
        example = f"Failing step (reported as it is, not shrunk: it left ranks stuck or dead): {broke.call}"
        return verdict("fail", f"RankFailure: {broke}", example, getattr(broke, "likely_cause", ""))
    except unittest.SkipTest as exc:
        return verdict("skipped", str(exc))
    except Exception as exc:  # every failure becomes a verdict
        if is_not_supported(exc):
            return verdict("not supported", _reason(exc))
        if _is_not_applicable(exc):
            return verdict("not applicable", _reason(exc))
        return verdict("fail", _message(exc), _example(exc), getattr(exc, "likely_cause", ""))
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        # BaseExceptionGroup from hypothesis, or a test framework's outcome.
        return verdict("fail", _message(exc), _example(exc), getattr(exc, "likely_cause", ""))
    return verdict("pass")


def _expand(
    checks: Sequence[Check], impl: Implementation, world_size: int = 0
) -> tuple[list[tuple[str, Check, Implementation]], list[Verdict]]:
    """Every run of ``checks`` as ``(name, check, implementation)`` (ddp checks once per entry point).

    Also "not supported" verdicts (in a world of ``world_size``) for the ddp
    checks whose entry points the module defines none of.
    """
    runs: list[tuple[str, Check, Implementation]] = []
    missing: list[Verdict] = []
    for c in checks:
        variants = c.variants(impl)
        runs.extend((name, c, variant) for name, variant in variants)
        if not variants:
            reason = f"{impl.ddp} defines none of {', '.join(c.ddp_apis)}"
            missing.append(Verdict(c.name, c.component, c.tier, world_size, "not supported", 0.0, reason))
    return runs, missing


def run_worldless(
    checks: Sequence[Check],
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None = None,
) -> None:
    """Run, once each and in this process, the checks of ``checks`` that need no world."""
    runs, missing = _expand([c for c in checks if not c.needs_world], impl)
    for v in missing:
        _record(v, verdicts, on_verdict)
    for name, c, variant in runs:
        _record(run_check(c, None, variant, name=name), verdicts, on_verdict)


def _record(verdict: Verdict, verdicts: list[Verdict], on_verdict: Callable[[Verdict], None] | None) -> None:
    verdicts.append(verdict)
    if on_verdict is not None:
        on_verdict(verdict)


def run_checks(
    checks: Sequence[Check],
    impl: Implementation,
    world_sizes: Sequence[int] = (2, 3),
    *,
    backend: str = "gloo",
    tier: str = "all",
    max_examples: int | None = 10,
    timeout: float = 120.0,
    worlds: Callable[[int], WorldLike] | None = None,
    on_verdict: Callable[[Verdict], None] | None = None,
    components: Sequence[str] | None = None,
) -> Report:
    """Run ``checks`` (already selected): the world-less ones once, the others in a world of each size.

    Each size gets one world, reused by all its checks and closed afterwards:
    a ``nemo_dist.testing.World(size, backend, timeout)`` (the next size's
    ranks start in the background while this size's checks run, building
    their first DDP there when ddp checks are selected), or
    ``worlds(size)`` when given (the caller then owns and closes it). Steps of a World run
    under adaptive deadlines capped by ``timeout`` (see
    :mod:`~nemo_dist.conformance._deadline`). Hypothesis runs with
    ``max_examples`` and no database (see :func:`hypothesis_settings`).
    ``on_verdict`` is called after each check (progress output);
    ``components`` (default: those ``impl`` names) is recorded in the report.
    Verdicts come in run order: world-less checks, then by world size, then by check.
    """
    start = time.perf_counter()
    verdicts: list[Verdict] = []
    notes: list[str] = []
    deadlines = Deadlines(timeout)
    with hypothesis_settings(max_examples), contextlib.ExitStack() as owned:
        run_worldless(checks, impl, verdicts, on_verdict)
        if worlds is None:
            from nemo_dist.conformance._ddp_ranks import warm_up_ddp
            from nemo_dist.testing import World

            setup = warm_up_ddp if any(c.component == "ddp" and c.needs_world for c in checks) else None
            made = [owned.enter_context(World(size, backend, timeout, setup=setup)) for size in world_sizes]
        for index, size in enumerate(world_sizes):
            if worlds is not None:
                run_checks_in(checks, worlds(size), impl, verdicts, on_verdict, deadlines=deadlines, notes=notes)
                continue
            upcoming = [w for w in made[index + 1 :] if any(c.applies_to(w.size) for c in checks)]
            if upcoming:
                # The next world's ranks import torch and join while this world's checks run.
                with contextlib.suppress(Exception):  # a failed start is reported by that world's first check
                    upcoming[0].start(wait=False)
            run_checks_in(checks, made[index], impl, verdicts, on_verdict, deadlines=deadlines, notes=notes)
            made[index].close()
    return Report(
        tuple(verdicts),
        impl,
        backend,
        tier,
        max_examples,
        time.perf_counter() - start,
        tuple(dict.fromkeys(notes)),
        components=tuple(checked_components(impl) if components is None else components),
    )


def _detected_form(world: Any, impl: Implementation, notes: list[str]) -> Implementation:
    """Warm ``world`` up (imports on every rank); fix a gather callable's output form from its first call."""
    from nemo_dist.conformance import _gather_ranks
    from nemo_dist.conformance._deadline import warm

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the checks record what the implementation warns
            forms = warm(world, _gather_ranks.warm_up, impl)
    except (Exception, StepAborted):
        return impl  # the checks report what goes wrong
    if impl.gather_fn is None or impl.gather_form != "auto":
        return impl
    if len(set(forms)) == 1 and forms[0] is not None:
        notes.append(f"{impl.gather_fn}: output form {forms[0]!r}, detected from its first call")
        return dataclasses.replace(impl, gather_form=forms[0])
    return impl


def run_checks_in(
    checks: Sequence[Check],
    world: WorldLike,
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None,
    *,
    deadlines: Deadlines | None = None,
    notes: list[str] | None = None,
) -> None:
    """Run each of ``checks`` that needs a world in ``world``, in order, appending verdicts.

    A ``nemo_dist.testing.World`` is started first (so the first check's time
    is its own) and warmed up (the implementation imported on every rank);
    with ``deadlines`` its steps run under them.
    """
    runs, missing = _expand([c for c in checks if c.needs_world], impl, world.size)
    for v in missing:
        _record(v, verdicts, on_verdict)
    target: WorldLike = world
    if any(c.applies_to(world.size) for _, c, _ in runs):
        start = getattr(world, "start", None)
        if callable(start):
            # A start-up failure comes back as the first check's verdict.
            with contextlib.suppress(Exception):
                start()
        if deadlines is not None and callable(getattr(world, "run_with_deadline", None)):
            target = DeadlineWorld(world, deadlines)
        detected = _detected_form(target, impl, [] if notes is None else notes)
        if detected is not impl:
            runs = [(name, c, dataclasses.replace(v, gather_form=detected.gather_form)) for name, c, v in runs]
    for name, c, variant in runs:
        _record(run_check(c, target, variant, name=name), verdicts, on_verdict)
