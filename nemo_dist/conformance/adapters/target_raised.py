"""A target that raises on a rank, reported with its exception and never as a hang, for the suites whose rank side
runs the target once per spec and shares the run between their checks (tp, pp).

On a rank, :func:`run_once` keeps a run's report, or the :class:`TargetRaised` it raised, for the next check. In
the parent, :func:`run_reports` reads a raise on a rank back as that rank's :class:`Raised` report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.testing import RankFailure

__all__ = ["Raised", "TargetRaised", "run_once", "run_reports", "split_reports"]

#: A rank's report of one run (a suite's typed message).
Report = TypeVar("Report")


@dataclass(frozen=True)
class Raised:
    """What a rank whose target raised reports instead of its run: ``where`` it raised (``building the
    pipeline``, ``in forward``...), the ``error`` (``Type: message``) and the rank's whole ``traceback``."""

    where: str
    error: str
    traceback: str


class TargetRaised(Exception):
    """The target raised on this rank: ``"WHERE: Type: message"`` (WHERE: ``parallelizing``, ``in forward``...),
    the target's exception chained. Raised, not returned, so that ranks the target left waiting in a collective
    are reported stuck beside this rank's exception, never as a hang of their own; the parent reads a raise on
    every rank back as each rank's error report (:func:`run_reports`)."""


#: The first line of a rank's failure where the target raised (:class:`TargetRaised`).
_RAISED = re.compile(r"^rank \d+ raised (?:[\w.]+\.)?TargetRaised: (?P<where>[^:]+): (?P<error>.*)$")


def run_once(runs: dict[Any, Report | TargetRaised], key: Any, make: Callable[[], Report]) -> Report:
    """The report ``make()`` gives for ``key``, made once and kept in ``runs``; a :class:`TargetRaised` it raised
    is kept too, and raised again on every later call."""
    if key not in runs:
        try:
            runs[key] = make()
        except TargetRaised as exc:
            runs[key] = exc
    found = runs[key]
    if isinstance(found, TargetRaised):
        raise found
    return found


def run_reports(world: WorldLike, fn: Callable[..., Report], *args: Any) -> list[Report | Raised]:
    """Every rank's ``fn(*args)`` (a rank function raising :class:`TargetRaised`); a rank where the target raised
    reports :class:`Raised`. A target that raised on some ranks while
    others waited for it is the harness's ``RankFailure`` (the exception, and where the others were stuck), raised
    as it is: never a hang, never a report; so is a rank that died or broke elsewhere."""
    try:
        return world.run(fn, *args)
    except RankFailure as exc:
        found: list[Report | Raised] = []
        for rank in range(world.size):
            text = exc.failures.get(rank, "")
            raised = _RAISED.match(text.splitlines()[0]) if text else None
            if rank in exc.returned:
                found.append(exc.returned[rank])
            elif raised is None:
                raise
            else:
                found.append(Raised(where=raised["where"], error=raised["error"], traceback=text))
        return found


def split_reports(found: Sequence[Report | Raised]) -> tuple[list[tuple[int, Raised]], list[Report]]:
    """``(raised, reports)`` of :func:`run_reports`' answer: ``(rank, Raised)`` of every rank whose target
    raised, and the other ranks' reports, each in rank order."""
    raised = [(rank, r) for rank, r in enumerate(found) if isinstance(r, Raised)]
    return raised, [r for r in found if not isinstance(r, Raised)]
