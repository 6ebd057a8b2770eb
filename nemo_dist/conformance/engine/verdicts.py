"""Verdicts: the outcome of one check run, a whole run's :class:`Report`, and how an exception becomes one.

A check run ends in PASS, FAIL, HANG, NOT APPLICABLE, NOT SUPPORTED or
SKIPPED; :func:`classify` maps what a check raised to its outcome, message,
example and likely cause. The report decides the exit code.
"""

from __future__ import annotations

import dataclasses
import unittest
from dataclasses import dataclass, field
from typing import Literal

from nemo_dist.conformance.engine.deadlines import StepAborted, StepBroke, StepHung
from nemo_dist.conformance.engine.errors import ChosenByCode, NotApplicable, NotSupported
from nemo_dist.conformance.engine.explain import Finding, crashed_ranks, find, grouped, rank_failure
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.target import COMPONENTS

__all__ = [
    "Classified",
    "Finding",
    "Outcome",
    "Report",
    "Verdict",
    "classify",
    "is_not_applicable",
    "is_not_supported",
]

Outcome = Literal["pass", "fail", "hang", "not applicable", "not supported", "skipped"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check run in one world size (0: the check needs no world).

    ``message`` is the failure (or hang, not-applicable, not-supported, skip)
    text; ``example`` the shrunk hypothesis example ("Failing test case: ...")
    or, for a hang, the call that hung; ``cause`` the likely cause of a
    failure when the evidence names one; ``warnings`` what the check warned
    ("Category: message", each once); ``traceback`` the traceback of the
    code under test (the tool's frames folded) or a crashed rank's stderr
    tail; ``findings`` each distinct failure when hypothesis found more than
    one (``message`` then lists them all, ``cause`` is the first one named).
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
    traceback: str = ""
    findings: tuple[Finding, ...] = ()
    #: A "not applicable" caused by the code under test's own choice (:class:`ChosenByCode`): blocks a strict run.
    chosen: bool = False

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
    components: tuple[str, ...] = COMPONENTS
    #: The hypothesis seed of every check of the run (None: not seeded, as under torchrun).
    seed: int | None = None
    #: The command that ran it, less its check selection, world sizes and seed ("": not run from a command).
    command: str = ""
    #: Whether ``command`` fixes the world itself (torchrun's ``--nproc-per-node``): no ``--world-sizes`` added.
    command_sets_world: bool = False

    def count(self, outcome: Outcome) -> int:
        """Number of verdicts with ``outcome``."""
        return sum(v.outcome == outcome for v in self.verdicts)

    def blocking(self, strict: bool = False) -> list[Verdict]:
        """The verdicts that make the run fail.

        Core failures and hangs always; with ``strict``, any failure or hang,
        any "not supported", and any "not applicable" the code under test
        chose (a strict run demands the whole contract).
        """
        if strict:
            return [v for v in self.verdicts if v.failed or v.outcome == "not supported" or v.chosen]
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


def is_not_supported(exc: BaseException) -> bool:
    """Whether ``exc`` says "not supported": a ``NotSupported``, or every rank raising one."""
    return _raised_everywhere(exc, NotSupported)


def is_not_applicable(exc: BaseException) -> bool:
    """Whether ``exc`` says "not applicable": a ``NotApplicable`` (``ChosenByCode`` too), or every rank raising one."""
    return _raised_everywhere(exc, NotApplicable, ChosenByCode)


def is_chosen_by_code(exc: BaseException) -> bool:
    """Whether ``exc`` says "not applicable" for the code under test's own choice, here or on every rank."""
    return _raised_everywhere(exc, ChosenByCode)


def _raised_everywhere(exc: BaseException, *kinds: type[Exception]) -> bool:
    if isinstance(exc, kinds):
        return True
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return all(
            isinstance(text, str) and any(f"rank {rank} raised {kind.__name__}:" in text for kind in kinds)
            for rank, text in failures.items()
        )
    return False


def _reason(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values())).splitlines()[0]
        ranks = ", ".join(str(r) for r in failures)
        return f"{first.split('raised ', 1)[-1]} (rank {ranks})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class Classified:
    """What :func:`classify` makes of an exception: the verdict's outcome and texts (see :class:`Verdict`)."""

    outcome: Outcome
    message: str
    example: str = ""
    cause: str = ""
    traceback: str = ""
    findings: tuple[Finding, ...] = ()
    chosen: bool = False


def _group(group: BaseException, failures: list[BaseException]) -> Classified:
    """Each distinct failure of a group (hypothesis found several) as its own finding."""
    findings = tuple(find(exc) for exc in failures)
    head = str(getattr(group, "message", "")).strip() or f"{len(findings)} distinct failures"
    message = "\n\n".join([head, *(f"[{i} of {len(findings)}] {f.message}" for i, f in enumerate(findings, 1))])
    cause = next((f.cause for f in findings if f.cause), "")
    return Classified("fail", message, "", cause, "", findings)


def classify(exc: BaseException) -> Classified:
    """The outcome and texts of a check run that raised ``exc``.

    A step past its deadline is a hang (the hung call as example); a step
    that left ranks stuck or dead a failure reported as it is (not shrunk),
    a dead rank as a crash of that rank with no likely cause;
    ``unittest.SkipTest`` skipped; ``NotSupported`` / ``NotApplicable``
    (raised here or on every rank) their outcome with the reason; a group of
    failures (hypothesis found several) one finding each; anything else a
    failure with its message, the shrunk hypothesis example, the likely
    cause the check attached (``exc.likely_cause``) and the traceback of the
    code under test (see :mod:`~nemo_dist.conformance.engine.explain`).
    """
    if isinstance(exc, StepHung):
        return Classified("hang", f"{exc.deadline_note}\n{exc}", f"Hung step: {exc.call}")
    if isinstance(exc, StepAborted):
        example = f"Failing step (reported as it is, not shrunk: it left ranks stuck or dead): {exc.call}"
        cause = getattr(exc, "likely_cause", "")
        if not isinstance(exc, StepBroke):
            return Classified("fail", f"RankFailure: {exc}", example, cause)
        found = rank_failure(exc.failure)
        crashed = bool(crashed_ranks(exc.failure.failures))
        return Classified("fail", found.message, example, "" if crashed else cause, found.traceback)
    if isinstance(exc, unittest.SkipTest):
        return Classified("skipped", str(exc))
    if isinstance(exc, Exception):
        if is_not_supported(exc):
            return Classified("not supported", _reason(exc))
        if is_not_applicable(exc):
            return Classified("not applicable", _reason(exc), chosen=is_chosen_by_code(exc))
    failures = grouped(exc)
    if failures:
        return _group(exc, failures)
    found = find(exc)
    return Classified("fail", found.message, found.example, found.cause, found.traceback)
