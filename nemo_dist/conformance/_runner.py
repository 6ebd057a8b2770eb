"""Run conformance checks against an implementation and collect verdicts.

One :class:`Verdict` per check and world size; a :class:`Report` holds them
and decides the exit code. Checks run in persistent worlds (one
``nemo_dist.testing.World`` per size, reused by every check of that size) or
in any ``WorldLike`` a caller provides (the torchrun adapter, a pytest
fixture). A check that crashes or hangs its world fails alone: the harness
replaces the world and the next check gets healthy ranks.
"""

from __future__ import annotations

import contextlib
import time
import unittest
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from nemo_dist.conformance._impl import Implementation, NotSupported
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
    "select_checks",
]

Outcome = Literal["pass", "fail", "not supported", "skipped"]
TierChoice = Literal["core", "extended", "all"]

#: Accepted values of ``tier``.
TIERS: tuple[str, ...] = ("core", "extended", "all")

_PROFILE = "nemo_dist_conformance"
_RESTORE_PROFILE = "nemo_dist_conformance_restore"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check in one world size.

    ``message`` is the failure (or not-supported / skip reason) text;
    ``example`` the shrunk hypothesis example ("Failing test case: ..."),
    empty when the check raised outside hypothesis or passed.
    """

    check: str
    component: str
    tier: str
    world_size: int
    outcome: Outcome
    seconds: float
    message: str = ""
    example: str = ""

    @property
    def failed(self) -> bool:
        """Whether the check broke the contract (or crashed)."""
        return self.outcome == "fail"


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

        Core failures always; with ``strict``, any failure and any
        "not supported" (a strict run demands the whole contract).
        """
        if strict:
            return [v for v in self.verdicts if v.outcome in ("fail", "not supported")]
        return [v for v in self.verdicts if v.failed and v.tier == "core"]

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing blocks (see :meth:`blocking`), else 1."""
        return 1 if self.blocking(strict) else 0


def select_checks(
    checks: Iterable[Check],
    impl: Implementation,
    tier: str = "all",
    select: str | None = None,
    components: Iterable[str] | None = None,
) -> list[Check]:
    """The checks of ``tier`` and of the checked components, in the given order.

    ``tier`` is "core", "extended" or "all"; ``select`` keeps only checks whose
    name contains it; ``components`` defaults to those ``impl`` names (not
    ``None``). Raises ``ValueError`` for an unknown tier.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}; got {tier!r}")
    wanted = set(checked_components(impl) if components is None else components)
    return [
        c
        for c in checks
        if (tier == "all" or c.tier == tier) and c.component in wanted and (not select or select in c.name)
    ]


def checked_components(impl: Implementation) -> tuple[str, ...]:
    """The components ``impl`` names a module for, in the order gather, ddp, config."""
    return tuple(c for c in ("gather", "ddp", "config") if getattr(impl, c) is not None)


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
    if isinstance(exc, NotSupported):
        return True
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return all(
            isinstance(text, str) and f"rank {rank} raised NotSupported:" in text
            for rank, text in failures.items()
        )
    return False


def _not_supported_reason(exc: BaseException) -> str:
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


def run_check(check: Check, world: WorldLike, impl: Implementation) -> Verdict:
    """Run ``check`` once in ``world`` against ``impl`` and return its verdict.

    Never raises for a failing implementation: ``NotSupported`` (raised in the
    parent or on every rank) gives "not supported"; ``unittest.SkipTest`` (the
    environment cannot run the check, e.g. it needs a process outside any
    world) and a world size outside the check's range give "skipped"; an assertion or any other
    exception (``RankFailure``, ``WorldTimeout`` included) gives "fail" with
    its message and the shrunk hypothesis example. Only ``KeyboardInterrupt``
    and ``SystemExit`` propagate.
    """
    start = time.perf_counter()

    def verdict(outcome: Outcome, message: str = "", example: str = "") -> Verdict:
        return Verdict(
            check.name,
            check.component,
            check.tier,
            world.size,
            outcome,
            time.perf_counter() - start,
            message,
            example,
        )

    if not check.applies_to(world.size):
        limit = f"{check.min_world}.." + ("" if check.max_world is None else str(check.max_world))
        return verdict("skipped", f"runs in worlds of {limit} ranks")
    try:
        check(world, impl)
    except unittest.SkipTest as exc:
        return verdict("skipped", str(exc))
    except Exception as exc:  # every failure becomes a verdict
        if is_not_supported(exc):
            return verdict("not supported", _not_supported_reason(exc))
        return verdict("fail", _message(exc), _example(exc))
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        # BaseExceptionGroup from hypothesis, or a test framework's outcome.
        return verdict("fail", _message(exc), _example(exc))
    return verdict("pass")


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
    """Run ``checks`` (already selected) in a world of each size; return the report.

    Each size gets one world, reused by all its checks and closed afterwards:
    a ``nemo_dist.testing.World(size, backend, timeout)``, or ``worlds(size)``
    when given (the caller then owns and closes it). Hypothesis runs with
    ``max_examples`` and no database (see :func:`hypothesis_settings`).
    ``on_verdict`` is called after each check (progress output);
    ``components`` (default: those ``impl`` names) is recorded in the report.
    Verdicts come in run order: by world size, then by check.
    """
    start = time.perf_counter()
    verdicts: list[Verdict] = []
    with hypothesis_settings(max_examples):
        for size in world_sizes:
            if worlds is not None:
                run_checks_in(checks, worlds(size), impl, verdicts, on_verdict)
                continue
            from nemo_dist.testing import World

            with World(size, backend, timeout) as world:
                run_checks_in(checks, world, impl, verdicts, on_verdict)
    return Report(
        tuple(verdicts),
        impl,
        backend,
        tier,
        max_examples,
        time.perf_counter() - start,
        components=tuple(checked_components(impl) if components is None else components),
    )


def run_checks_in(
    checks: Sequence[Check],
    world: WorldLike,
    impl: Implementation,
    verdicts: list[Verdict],
    on_verdict: Callable[[Verdict], None] | None,
) -> None:
    """Run each of ``checks`` in ``world`` in order, appending its verdict and reporting it to ``on_verdict``."""
    start = getattr(world, "start", None)
    if callable(start) and any(c.applies_to(world.size) for c in checks):
        # Start now so the first check's time is its own; a start-up failure
        # comes back as the first check's verdict.
        with contextlib.suppress(Exception):
            start()
    for check in checks:
        verdict = run_check(check, world, impl)
        verdicts.append(verdict)
        if on_verdict is not None:
            on_verdict(verdict)
