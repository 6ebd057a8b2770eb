"""One call across a World's ranks: pickling what is sent, gathering what comes back.

:func:`pickle_call` turns ``(fn, args, kwargs)`` into the blob every rank
unpickles, or says why it cannot; :func:`gather` collects one answer per rank
(a reply, or the rank's death) within a deadline. This module imports no torch.
"""

from __future__ import annotations

import importlib
import pickle
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from nemo_dist.testing import _protocol, processes
from nemo_dist.testing._errors import FunctionNotPicklable
from nemo_dist.testing.progress import ProgressWatch

__all__ = ["STARTUP_SEQ", "describe", "gather", "pickle_call", "receive", "warning_category"]

#: The sequence number of the start: each rank's answer is its Ready (or Raised).
STARTUP_SEQ = -1


def warning_category(path: str) -> type[Warning]:
    """The Warning subclass named "module:qualname", or UserWarning if it cannot be found."""
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return UserWarning
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def describe(fn: Any) -> str:
    """``module.qualname`` of ``fn`` (its repr when it has no qualname)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}" if module else qualname


def pickle_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle ``(fn, args, kwargs)`` or raise FunctionNotPicklable saying why."""
    if not callable(fn):
        raise TypeError(f"World.run expects a callable as fn, got {type(fn).__name__}: {fn!r}")
    qualname = getattr(fn, "__qualname__", "")
    name = describe(fn)
    remedy = (
        "it must be a module-level function of an importable module "
        "(lambdas, nested functions and functions of __main__ cannot be sent to rank processes)"
    )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise FunctionNotPicklable(f"cannot send {name} to the ranks: {remedy}")
    if getattr(fn, "__module__", None) == "__main__":
        raise FunctionNotPicklable(f"cannot send {name} to the ranks: {remedy}")
    try:
        return _protocol.dumps((fn, args, kwargs))
    except Exception as exc:
        try:
            pickle.dumps(fn, pickle.HIGHEST_PROTOCOL)
        except Exception:
            raise FunctionNotPicklable(
                f"cannot send {name} to the ranks ({type(exc).__name__}: {exc}): {remedy}"
            ) from exc
        raise FunctionNotPicklable(
            f"cannot send the arguments of {name} to the ranks: "
            f"{type(exc).__name__}: {exc}; arguments must be picklable"
        ) from exc


def gather(
    ranks: list[processes.RankProcess],
    seq: int,
    deadline_s: float,
    grace_s: float,
    *,
    watch: ProgressWatch | None = None,
    limit_s: float | None = None,
) -> tuple[dict[int, Any], dict[int, str], set[int], bool]:
    """Collect one answer per rank for call ``seq``.

    Returns ``(replies, deaths, pending, timed_out)``: the answers by rank,
    the ranks that died with their exit description, the ranks that did not
    answer, and whether the deadline (rather than the ``grace_s`` seconds the
    others get after a first failure) ended the wait. With a ``watch``, the
    deadline, and the grace after a first failure, are extended one probe
    interval at a time while the unfinished ranks are still working
    (:meth:`ProgressWatch.still_working`), up to ``limit_s`` seconds in all.
    """
    start = time.monotonic()
    end = start + deadline_s
    hard_end = start + max(deadline_s, limit_s if limit_s is not None else deadline_s)
    grace_end: float | None = None
    pending = set(range(len(ranks)))
    replies: dict[int, Any] = {}
    deaths: dict[int, str] = {}
    owner: dict[Any, int] = {}
    for r in ranks:
        for s in r.sentinels():
            owner[s] = r.rank
    while pending:
        limit = end if grace_end is None else min(end, grace_end)
        now = time.monotonic()
        remaining = limit - now
        if remaining <= 0:
            if watch is not None and now < hard_end and watch.still_working(pending):
                # Still working, not stuck: past the deadline, or past the grace after another rank failed
                # (a rank importing or computing on a busy machine gets to answer what it would answer).
                if grace_end is None:
                    end = min(now + watch.interval_s, hard_end)
                else:
                    grace_end = min(now + watch.interval_s, hard_end)
                    end = max(end, grace_end)
                continue
            break
        ready = wait([s for s, r in owner.items() if r in pending], remaining)
        for s in ready:
            rank = owner[s]
            if rank not in pending:
                continue
            failed = receive(ranks[rank], seq, replies, deaths)
            if rank in replies or rank in deaths:
                pending.discard(rank)
            if failed and grace_end is None:
                grace_end = time.monotonic() + grace_s
    timed_out = bool(pending) and grace_end is None
    return replies, deaths, pending, timed_out


def receive(r: processes.RankProcess, seq: int, replies: dict[int, Any], deaths: dict[int, str]) -> bool:
    """Read what rank ``r`` has to say about call ``seq`` into ``replies`` or ``deaths``; True if it failed."""
    eof = False
    while True:
        try:
            if not r.conn.poll():
                break
            msg = r.conn.recv()
        except (EOFError, OSError):
            eof = True
            break
        except Exception as exc:
            replies[r.rank] = _protocol.Raised(
                seq,
                r.rank,
                type(exc).__qualname__,
                f"the parent could not unpickle the reply: {exc}",
                "",
            )
            return True
        if seq == STARTUP_SEQ and isinstance(msg, _protocol.Ready):
            replies[r.rank] = msg
            return False
        if getattr(msg, "seq", None) != seq:
            continue  # a late answer to an earlier call
        replies[r.rank] = msg
        return isinstance(msg, _protocol.Raised)
    if eof or r.proc.poll() is not None or (r.pidfd is not None and wait([r.pidfd], 0)):
        # EOF or exit: the process is gone (or going).
        processes.wait_exit([r], processes.KILL_AFTER_S)
        deaths[r.rank] = processes.death_text(r)
        return True
    return False
