"""Rank processes of a World: waiting, killing, reaping, stack dumps.

The parent-side bookkeeping of the rank processes a
:class:`~nemo_dist.testing.World` runs (started by :mod:`.launcher`): each
one's socket, pidfd, stderr file and faulthandler stack file, and the texts
that describe how it ended. What travels over the socket is
:mod:`._protocol`'s business. This module imports no torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "KILL_AFTER_S",
    "REAP_AFTER_KILL_S",
    "Process",
    "RankProcess",
    "death_text",
    "dump_stacks",
    "exit_text",
    "kill_and_wait",
    "left_running_text",
    "open_pidfd",
    "reap",
    "stderr_tail",
    "wait_exit",
]

#: Seconds a rank gets to exit (after EXIT, EOF or SIGTERM) before it is killed.
KILL_AFTER_S = 5.0
#: Seconds a process gets to vanish after SIGKILL before it is reported and left running.
REAP_AFTER_KILL_S = 10.0
_STDERR_TAIL_BYTES = 4000
# Processes that outlived SIGKILL (stuck in the kernel, e.g. in a GPU driver
# call). Kept referenced: a collected Popen of a running process warns again.
_LEFT_RUNNING: list[Any] = []


class Process(Protocol):
    """What the teardown needs of a process: ``subprocess.Popen`` has it."""

    pid: int

    def poll(self) -> int | None:
        """The return code if the process exited, else None."""

    def kill(self) -> None:
        """Send SIGKILL."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit (raising TimeoutExpired after ``timeout`` s); the return code."""

    def send_signal(self, sig: int) -> None:
        """Send signal ``sig``."""


@dataclass
class RankProcess:
    """Parent-side handle of one rank process."""

    rank: int
    proc: Process
    conn: Connection
    pidfd: int | None
    stderr_path: Path
    stack_path: Path
    #: Where the rank appends a stack dump each time it gets SIGUSR1 (see :mod:`.progress`).
    sample_path: Path | None = field(default=None)
    exit_text: str | None = field(default=None)
    #: True once the process outlived SIGKILL and was left running (never waited for again).
    left_running: bool = field(default=False)

    def sentinels(self) -> list[Any]:
        """What to ``multiprocessing.connection.wait`` on: its socket, and its pidfd when there is one."""
        return [self.conn] if self.pidfd is None else [self.conn, self.pidfd]


def open_pidfd(pid: int) -> int | None:
    """A pidfd of process ``pid`` (readable once it exits), or None where the OS has none."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:  # pragma: no cover - not Linux
        return None
    try:
        return int(opener(pid))
    except OSError:  # pragma: no cover - old kernel
        return None


def stderr_tail(path: Path, limit: int = _STDERR_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of the file at ``path`` as text ("..." first if cut; "" if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return ("...\n" + text) if size > limit else text


def exit_text(returncode: int) -> str:
    """Describe a Popen return code: "exit code N" or "killed by signal SIGNAME"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exit code {returncode}"


def wait_exit(ranks: list[RankProcess], timeout: float) -> None:
    """Wait until every rank in ``ranks`` exited or ``timeout`` passed."""
    end = time.monotonic() + timeout
    alive = [r for r in ranks if r.proc.poll() is None]
    while alive:
        remaining = end - time.monotonic()
        if remaining <= 0:
            return
        fds = [r.pidfd for r in alive if r.pidfd is not None]
        if fds:
            wait(fds, remaining)
        else:  # pragma: no cover - no pidfd: Popen's own timed wait
            try:
                alive[0].proc.wait(remaining)
            except subprocess.TimeoutExpired:
                return
        alive = [r for r in alive if r.proc.poll() is None]


def kill_and_wait(proc: Process, timeout: float = REAP_AFTER_KILL_S) -> int | None:
    """SIGKILL ``proc`` if it still runs and wait at most ``timeout`` s for it.

    Returns its return code, or None when it has not exited by then: such a
    process (stuck in the kernel) is left running, never waited for forever.
    """
    if proc.poll() is None:
        proc.kill()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _LEFT_RUNNING.append(proc)
        return None


def _finish(r: RankProcess) -> int | None:
    """:func:`kill_and_wait` once per rank: one that was left running is not waited for again."""
    if r.left_running:
        return r.proc.poll()
    code = kill_and_wait(r.proc)
    r.left_running = code is None
    return code


def left_running_text(ranks: list[RankProcess]) -> str:
    """Say which ranks outlived SIGKILL and were left running."""
    which = ", ".join(f"rank {r.rank} (pid {r.proc.pid})" for r in ranks)
    verb = "was" if len(ranks) == 1 else "were"
    return f"{which} did not exit within {REAP_AFTER_KILL_S:g} s of SIGKILL and {verb} left running"


def reap(r: RankProcess) -> bool:
    """Kill the rank if it still runs, wait for it (bounded), close its socket and pidfd.

    Returns False when the process outlived SIGKILL and was left running.
    """
    gone = _finish(r) is not None
    r.conn.close()
    if r.pidfd is not None:
        os.close(r.pidfd)
        r.pidfd = None
    return gone


def death_text(r: RankProcess) -> str:
    """The death report of a rank that exited (or is killed now): how it ended and its stderr tail."""
    code = _finish(r)
    tail = stderr_tail(r.stderr_path).rstrip()
    how = exit_text(code) if code is not None else f"closed its pipe; {left_running_text([r])}"
    text = f"rank {r.rank} died: {how}"
    return f"{text}\n--- rank {r.rank} stderr (tail) ---\n{tail}" if tail else text


def dump_stacks(targets: list[RankProcess]) -> dict[int, str]:
    """SIGTERM the ranks (faulthandler dumps every thread), reap, return each rank's stack text."""
    for r in targets:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
    wait_exit(targets, KILL_AFTER_S)
    stacks: dict[int, str] = {}
    for r in targets:
        killed = r.proc.poll() is None
        gone = _finish(r) is not None
        try:
            stack = r.stack_path.read_text("utf-8", "replace").strip()
        except OSError:
            stack = ""
        if not stack:
            stack = "(no stack was dumped" + (f"; killed with SIGKILL after {KILL_AFTER_S:g} s)" if killed else ")")
        tail = stderr_tail(r.stderr_path, 1500).rstrip()
        if tail:
            stack += f"\n--- rank {r.rank} stderr (tail) ---\n{tail}"
        if not gone:
            stack += f"\n({left_running_text([r])})"
        stacks[r.rank] = stack
    return stacks
