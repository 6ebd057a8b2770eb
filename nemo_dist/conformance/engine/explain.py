"""Explain a failed check run: its message, the traceback of the code under test, a crashed rank.

What a check raised becomes a :class:`Finding` (or one per distinct failure
hypothesis found): the exception's message, hypothesis's shrunk example, the
likely cause a check attached, and the traceback of the code under test, the
tool's own frames folded into one line (:func:`fold_tool_frames`). A rank that
raised is shown with its traceback (one per distinct traceback); a rank that
died is reported as a crash of that rank ("rank 1 crashed: killed by signal
SIGSEGV") with its stderr tail, never under a likely cause.
"""

from __future__ import annotations

import re
import sys
import traceback as tb
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TOOL_PATHS",
    "Finding",
    "add_note",
    "crashed_ranks",
    "find",
    "fold_tool_frames",
    "grouped",
    "likely_cause",
    "rank_failure",
]

#: Path fragments of the tool's own frames: folded out of tracebacks.
TOOL_PATHS: tuple[str, ...] = (
    "nemo_dist/conformance/",
    "nemo_dist/testing/",
    "/hypothesis/",
    "/_hypothesis_",
    "/_pytest/",
    "/pluggy/",
)

def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+), or the same ``__notes__`` that 3.11 and pytest read, before it."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line \d+')
_TRACEBACK_HEAD = "Traceback (most recent call last):"
_DIED = re.compile(r"^rank (\d+) died: (.*)$")


@dataclass(frozen=True)
class Finding:
    """One failure: its message, shrunk example, likely cause and the traceback of the code under test."""

    message: str
    example: str = ""
    cause: str = ""
    traceback: str = ""


def grouped(exc: BaseException) -> list[BaseException] | None:
    """The failures of an exception group (nested groups flattened), or None when ``exc`` is not a group.

    Hypothesis raises a group when it found several distinct failures
    (``BaseExceptionGroup``; the ``exceptiongroup`` backport before Python 3.11).
    """
    subs = getattr(exc, "exceptions", None)
    if not isinstance(subs, tuple) or not all(isinstance(e, BaseException) for e in subs):
        return None
    found: list[BaseException] = []
    for sub in subs:
        found += grouped(sub) or [sub]
    return found


def likely_cause(exc: BaseException) -> str:
    """The likely cause a check attached to ``exc``; for a group, the first one any of its failures carries.

    A check attaches its cause to the assertion it raised; when hypothesis
    found several distinct failures, those assertions sit inside a group.
    """
    for found in (exc, *(grouped(exc) or ())):
        cause = str(getattr(found, "likely_cause", "") or "")
        if cause:
            return cause
    return ""


def _tool_frame(path: str) -> bool:
    normalised = path.replace("\\", "/")
    return any(part in normalised for part in TOOL_PATHS)


def fold_tool_frames(text: str) -> str:
    """``text`` with each run of the tool's own traceback frames (:data:`TOOL_PATHS`) folded into one line.

    Works on Python tracebacks and faulthandler dumps: a frame is a
    ``File "path", line N`` line and the more indented lines under it. Other
    frames (the code under test, torch) and every other line are kept.
    """
    lines = text.splitlines()
    out: list[str] = []
    folded = 0
    indent = ""
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match is None:
            if folded:
                out.append(_folded_line(indent, folded))
                folded = 0
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        depth = len(match.group("indent"))
        while end < len(lines) and len(lines[end]) - len(lines[end].lstrip()) > depth and lines[end].strip():
            end += 1
        if _tool_frame(match.group("path")):
            indent = match.group("indent")
            folded += 1
        else:
            if folded:
                out.append(_folded_line(indent, folded))
                folded = 0
            out.extend(lines[i:end])
        i = end
    if folded:
        out.append(_folded_line(indent, folded))
    return "\n".join(out)


def _folded_line(indent: str, count: int) -> str:
    return f"{indent}... {count} tool frame{'s' if count > 1 else ''}"


def _under_test(text: str) -> bool:
    """Whether a traceback has a frame outside the tool (else it says nothing the message does not)."""
    return any((m := _FRAME.match(line)) is not None and not _tool_frame(m.group("path")) for line in text.splitlines())


def _parent_traceback(exc: BaseException) -> str:
    """The folded traceback of ``exc`` raised in this process, or "" when all its frames are the tool's."""
    if exc.__traceback__ is None:
        return ""
    text = "".join(tb.format_tb(exc.__traceback__))
    if not _under_test(text):
        return ""
    return fold_tool_frames(f"{_TRACEBACK_HEAD}\n{text.rstrip()}")


def crashed_ranks(failures: dict[int, str]) -> dict[int, str]:
    """The ranks of a ``RankFailure.failures`` that died, with how: ``{1: "killed by signal SIGSEGV"}``."""
    found: dict[int, str] = {}
    for rank, text in failures.items():
        match = _DIED.match(text.splitlines()[0] if text else "")
        if match is not None:
            found[rank] = match.group(2)
    return found


def _split_rank_text(text: str) -> tuple[str, str]:
    """A rank's failure text as (what happened, its traceback or dump) at its first traceback line."""
    lines = text.rstrip().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(_TRACEBACK_HEAD) or line.startswith("--- rank ") or line.endswith("its stack:"):
            cut = i + 1 if line.endswith("its stack:") else i
            return "\n".join(lines[:cut]), "\n".join(lines[cut:])
    return text.rstrip(), ""


def _crash_tail(rest: str) -> str:
    """A dead rank's stderr tail without its ``--- rank R stderr (tail) ---`` header (to compare ranks)."""
    return "\n".join(line for line in rest.splitlines() if not line.startswith("--- rank ")).strip()


def rank_failure(failure: Any) -> Finding:
    """A ``RankFailure`` as a finding: each rank's error in the message, the distinct tracebacks folded.

    When a rank died, the finding is that crash (:func:`crashed_ranks`):
    "rank R crashed: how" with its stderr tail (a Python stack when it died
    of a fatal signal); the ranks left waiting for it get one line each.
    """
    failures: dict[int, str] = dict(failure.failures)
    where = str(getattr(failure, "context", ""))
    crashed = crashed_ranks(failures)
    if crashed:
        return _crash(failures, crashed, where)
    size = getattr(failure, "world_size", None)
    count = f"{len(failures)}{f' of {size}' if size is not None else ''}"
    lines = [f"RankFailure: {count} rank(s) failed{where}:"]
    seen: dict[str, int] = {}
    tracebacks: list[str] = []
    for rank, text in failures.items():
        what, rest = _split_rank_text(text)
        lines.append(f"  {what}" if what else f"  rank {rank} failed")
        if not rest:
            continue
        folded = fold_tool_frames(rest)
        if folded in seen:
            tracebacks.append(f"rank {rank}: the same traceback as rank {seen[folded]}")
        else:
            seen[folded] = rank
            tracebacks.append(f"--- rank {rank} ---\n{folded}")
    return Finding("\n".join(lines), traceback="\n".join(tracebacks))


def _crash(failures: dict[int, str], crashed: dict[int, str], where: str) -> Finding:
    """The finding of a step in which ranks died: each crash with its stderr tail (each distinct tail once)."""
    message = "RankFailure: " + "; ".join(f"rank {r} crashed: {how}" for r, how in crashed.items()) + where
    details: list[str] = []
    tails: dict[str, int] = {}
    for rank, text in failures.items():
        what, rest = _split_rank_text(text)
        if rank not in crashed:
            details.append(what.splitlines()[0] if what else f"rank {rank} failed")
            continue
        tail = _crash_tail(rest)
        if tail and tail in tails:
            details.append(f"rank {rank} crashed: {crashed[rank]} (its stderr tail is rank {tails[tail]}'s)")
            continue
        tails.setdefault(tail, rank)
        details.append(f"rank {rank} crashed: {crashed[rank]}")
        kept = [line for line in rest.splitlines() if not line.startswith("Extension modules:")]
        if kept:
            details.append(fold_tool_frames("\n".join(kept)))
    return Finding(message, traceback="\n".join(details))


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _example(exc: BaseException) -> str:
    notes = [str(n) for n in getattr(exc, "__notes__", ()) or ()]
    return "\n".join(notes).strip()


def find(exc: BaseException) -> Finding:
    """One failure raised by a check (not a group): message, example, likely cause and traceback.

    A ``RankFailure`` is explained by :func:`rank_failure` (hypothesis's
    example kept); anything else by its message and, when it passed through
    the code under test, its folded traceback.
    """
    example = _example(exc)
    cause = likely_cause(exc)
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        found = rank_failure(exc)
        return Finding(found.message, example, "" if crashed_ranks(failures) else cause, found.traceback)
    return Finding(_message(exc), example, cause, _parent_traceback(exc))
