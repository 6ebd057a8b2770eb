"""Whether unfinished ranks are stuck or still working: stack samples and CPU time, an interval apart.

A call that outlives its deadline is not necessarily hung: on a busy machine a
rank may still be importing, compiling bytecode or computing. A
:class:`ProgressWatch` tells the two apart without stopping the ranks. Each
probe reads every unfinished rank's state and CPU time (``/proc``) and its stack dump
(requested with ``SIGUSR1``, which a sampler thread of the rank answers into
its sample file, holding the GIL: see ``_stack_sampler``; a rank blocked in C
code has released it), then asks for the next dump. A rank is *blocked*
when, over one interval, it slept, its dump did not change and it used
(almost) no CPU: it waits in a collective or a receive. A call is judged
hung only when every unfinished rank is blocked. This module
imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nemo_dist.testing._stack_sampler import PROBE_SIGNAL
from nemo_dist.testing.processes import RankProcess

__all__ = ["PROBE_INTERVAL_S", "ProcStat", "ProgressWatch", "proc_stat", "request_dump"]

#: Seconds between two probes of the unfinished ranks.
PROBE_INTERVAL_S = 1.0
#: CPU seconds per probe interval above which a rank counts as working. A rank
#: waiting in gloo uses none; a rank importing on a machine loaded many times
#: over still gets tens of milliseconds a second. 30 ms is three clock ticks,
#: above what answering the dump request itself costs.
_WORKING_CPU_S = 0.03
#: Process states (``/proc/PID/stat``) of a rank that is not waiting on others:
#: running or runnable, and uninterruptible disk sleep (reading modules, paging).
_BUSY_STATES = frozenset("RD")

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc`` says of a process: its state letter and CPU seconds used (all threads, and its descendants)."""

    state: str
    cpu_s: float


def _own_stat(pid: int) -> tuple[str, float] | None:
    """Process ``pid``'s state and CPU seconds: its own (all threads) and its children's that it has waited for."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        return fields[0], sum(int(f) for f in fields[11:15]) / _TICKS_PER_S
    except (IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (every thread's), where ``/proc`` lists them; [] where it does not."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def proc_stat(pid: int) -> ProcStat | None:
    """The state of process ``pid`` and the CPU seconds (user plus system) it and its descendants used, or None
    where unknown. A rank waiting on a subprocess that works (a compiler torch started) is working: the
    subprocess's CPU counts as the rank's."""
    own = _own_stat(pid)
    if own is None:
        return None
    state, cpu_s = own
    pending, seen = _children(pid), {pid}
    while pending:
        child = pending.pop()
        if child in seen:
            continue
        seen.add(child)
        found = _own_stat(child)
        if found is not None:
            cpu_s += found[1]
            pending += _children(child)
    return ProcStat(state, cpu_s)


def request_dump(r: RankProcess) -> int | None:
    """Ask rank ``r`` for a stack dump into its sample file; return the file's size before it.

    The dump (every thread, innermost frame first) is appended by the rank's
    stack sampler thread. None when the rank has no sample file (nothing is sent) or
    has exited.
    """
    if r.sample_path is None or r.proc.poll() is not None:
        return None
    try:
        offset = r.sample_path.stat().st_size
    except OSError:
        offset = 0
    try:
        r.proc.send_signal(PROBE_SIGNAL)
    except OSError:  # pragma: no cover - exited between poll and send
        return None
    return offset


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class _Sample:
    """One rank at one probe: its stack dump (requested an interval earlier) and its /proc stat."""

    stack: str
    stat: ProcStat | None


class ProgressWatch:
    """Probes the unfinished ranks of one call, one interval apart, to tell working from blocked.

    :meth:`still_working` is called each time the call's current deadline
    passes; the caller gives the ranks another ``interval_s`` while it returns
    True. ``verdict`` then says why the wait ended, for the timeout report.
    """

    def __init__(self, ranks: list[RankProcess], interval_s: float = PROBE_INTERVAL_S) -> None:
        self._ranks = ranks
        self.interval_s = float(interval_s)
        self._offsets: dict[int, int | None] = {}
        self._last: dict[int, _Sample] = {}
        self.verdict = ""

    def still_working(self, pending: set[int]) -> bool:
        """Probe the ``pending`` ranks; True unless every one of them was blocked over the last interval.

        A rank is blocked when it is asleep (not running, runnable or in disk
        sleep) at both ends of the interval, its dumps at both ends are the
        same and it used under 30 ms of CPU in between. The first two probes
        only collect samples (True): a judgement needs two dumps an interval
        apart.
        """
        blocked: list[int] = []
        working = False
        for rank in sorted(pending):
            sample = self._take(self._ranks[rank])
            before = self._last.pop(rank, None)
            if sample is not None:
                self._last[rank] = sample
            if before is None or sample is None or not _blocked(before, sample):
                working = True
            else:
                blocked.append(rank)
        if working:
            # The next dumps, read at the next probe. None is requested once the
            # ranks are judged blocked: the timeout's SIGTERM dump follows at once.
            for rank in pending:
                self._offsets[rank] = request_dump(self._ranks[rank])
            return True
        ranks = ", ".join(str(r) for r in blocked)
        self.verdict = (
            f"rank {ranks} blocked: the same stack and no CPU time over {self.interval_s:g} s "
            "(waiting in a collective or a receive)"
        )
        return False

    def _take(self, r: RankProcess) -> _Sample | None:
        """The dump requested at the previous probe, with the stat now (None before any dump was requested)."""
        stat = proc_stat(r.proc.pid)
        offset = self._offsets.pop(r.rank, None)
        stack = None if offset is None or r.sample_path is None else _read_from(r.sample_path, offset)
        return None if stack is None else _Sample(stack, stat)


def _blocked(before: _Sample, after: _Sample) -> bool:
    if not before.stack or not after.stack or before.stack != after.stack:
        return False  # a dump that did not arrive means the rank could not run its handler: not waiting
    if before.stat is None or after.stat is None:
        return True  # no /proc (not Linux): the unchanged stack decides
    if before.stat.state in _BUSY_STATES or after.stat.state in _BUSY_STATES:
        return False
    return after.stat.cpu_s - before.stat.cpu_s < _WORKING_CPU_S
