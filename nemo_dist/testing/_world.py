"""Persistent multi-process worlds for tests (parent side of the harness).

A :class:`World` owns ``size`` rank processes joined in one
``torch.distributed`` default group. They start on the first run and serve
every later run, so a call costs a few milliseconds instead of a process start.
The parent talks to each rank through a private socket pair carrying pickled
messages (:mod:`._protocol`); it rendezvous the ranks through a TCPStore it
hosts on 127.0.0.1 with an OS-assigned port. This module imports no torch at
load time.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import importlib
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_dist.testing import _protocol
from nemo_dist.testing._errors import (
    FunctionNotPicklable,
    RankFailure,
    WorldError,
    WorldTimeout,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FunctionNotPicklable", "RankFailure", "World", "WorldError", "WorldTimeout"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_KILL_AFTER_S = 5.0
_VERIFY_DEADLINE_S = 5.0
_STDERR_TAIL_BYTES = 4000
_STARTUP_SEQ = -1


@dataclass
class _Rank:
    """Parent-side handle of one rank process."""

    rank: int
    proc: subprocess.Popen[bytes]
    conn: Connection
    pidfd: int | None
    stderr_path: Path
    stack_path: Path
    exit_text: str | None = field(default=None)

    def sentinels(self) -> list[Any]:
        return [self.conn] if self.pidfd is None else [self.conn, self.pidfd]


def _open_pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:  # pragma: no cover - not Linux
        return None
    try:
        return int(opener(pid))
    except OSError:  # pragma: no cover - old kernel
        return None


def _tail(path: Path, limit: int = _STDERR_TAIL_BYTES) -> str:
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


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exit code {returncode}"


def _warning_category(path: str) -> type[Warning]:
    """The Warning subclass named "module:qualname", or UserWarning if it cannot be found."""
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return UserWarning
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def _describe(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}" if module else qualname


def _pickle_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle ``(fn, args, kwargs)`` or raise FunctionNotPicklable saying why."""
    if not callable(fn):
        raise TypeError(f"World.run expects a callable as fn, got {type(fn).__name__}: {fn!r}")
    qualname = getattr(fn, "__qualname__", "")
    name = _describe(fn)
    remedy = (
        "it must be a module-level function of an importable module "
        "(lambdas, nested functions and functions of __main__ cannot be sent to rank processes)"
    )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise FunctionNotPicklable(f"cannot send {name} to the ranks: {remedy}")
    if getattr(fn, "__module__", None) == "__main__":
        raise FunctionNotPicklable(f"cannot send {name} to the ranks: {remedy}")
    try:
        return pickle.dumps((fn, args, kwargs), pickle.HIGHEST_PROTOCOL)
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


class World:
    """A persistent world of ``size`` rank processes for tests.

    ``backend`` is the torch.distributed backend of the default group ("gloo"
    on CPU, "nccl" with one GPU per rank). ``timeout`` is the default deadline
    of one :meth:`run` in seconds. ``grace`` is how long the other ranks get to
    answer once one rank failed. ``startup_timeout`` bounds starting the ranks.
    ``setup`` (a module-level function, no arguments) runs once on every rank
    after it joined the group and before it reports ready, at every start:
    warm-up work (first imports, a first DDP) that a background
    ``start(wait=False)`` then does while the caller goes on.
    Ranks start lazily on the first run and are replaced after a hang or a
    death, so every run gets healthy ranks. Use as a context manager or call
    :meth:`close` (an ``atexit`` hook closes forgotten Worlds).

    Ranks die with their parent: on Linux through ``PR_SET_PDEATHSIG``, which
    follows the *thread* that started them (a World started from a thread that
    later exits loses its ranks; the next run reports the deaths and restarts
    them), and through EOF on their pipe otherwise.
    """

    def __init__(
        self,
        size: int,
        backend: str = "gloo",
        timeout: float = 60.0,
        *,
        grace: float = 2.0,
        startup_timeout: float = 120.0,
        setup: Callable[[], Any] | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"World size must be an int >= 1, got {size!r}")
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"World backend must be a backend name such as 'gloo', got {backend!r}")
        for label, value in (
            ("timeout", timeout),
            ("grace", grace),
            ("startup_timeout", startup_timeout),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"World {label} must be a number of seconds > 0, got {value!r}")
        self._setup = None if setup is None else _pickle_call(setup, (), {})
        self._size = size
        self._backend = backend
        self._timeout = float(timeout)
        self._grace = float(grace)
        self._startup_timeout = float(startup_timeout)
        # Children's process-group timeout outlives any parent deadline, so the
        # parent reports first.
        self._pg_timeout = max(2 * self._timeout, self._timeout + 60.0, self._startup_timeout)
        self._ranks: list[_Rank] = []
        self._ready = False
        self._store: Any = None
        self._tmpdir: Path | None = None
        self._sent_path: list[str] = []
        self._seq = 0
        self._closed = False
        self._warning_registry: dict[Any, Any] = {}
        atexit.register(self.close)

    # ------------------------------------------------------------------ public
    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def backend(self) -> str:
        """torch.distributed backend of the ranks' default group."""
        return self._backend

    @property
    def timeout(self) -> float:
        """Default deadline of one :meth:`run`, in seconds."""
        return self._timeout

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def pids(self) -> list[int]:
        """Process ids of the running ranks (empty before start or after close)."""
        return [r.proc.pid for r in self._ranks]

    @property
    def tmpdir(self) -> Path | None:
        """Private directory of the ranks' stderr and stack files, if started."""
        return self._tmpdir

    def start(self, *, wait: bool = True) -> None:
        """Start the ranks now if they are not running (run does it lazily).

        With ``wait=False`` the rank processes are launched and this returns at
        once: they join the group in the background (imports included) while
        the caller goes on, and the next :meth:`start` or :meth:`run` waits
        for them. Raises RankFailure or WorldTimeout if a rank cannot join the
        group (at the wait).
        """
        self._check_open()
        if not self._ranks:
            self._start(wait=wait)
        elif wait and not self._ready:
            self._finish_start()

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        ``fn`` must be a module-level function of an importable module; it and
        its arguments are pickled (by value for tensors). Raises
        FunctionNotPicklable before sending anything when they cannot be
        pickled, RankFailure when any rank raised or died (naming every failing
        rank with its traceback), WorldTimeout with every unfinished rank's
        stack when ``timeout`` seconds pass.
        """
        return self.run_with_deadline(self._timeout, fn, *args, **kwargs)

    def run_with_deadline(self, deadline_s: float, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Like :meth:`run`, but with a deadline of ``deadline_s`` seconds for this call.

        The ranks' process-group timeout is fixed at start (longer than the
        World's ``timeout``); a deadline beyond it lets gloo time out first.
        """
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}")
        self._check_open()
        blob = _pickle_call(fn, args, kwargs)
        self.start()
        return self._call(blob, float(deadline_s), _describe(fn))

    def close(self) -> None:
        """Stop the ranks and free every resource; idempotent.

        Ranks are asked to leave the group and exit, stragglers are killed after
        a few seconds, then the TCPStore and the private temp dir are removed.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._shutdown(graceful=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._ranks else "idle")
        return f"World(size={self._size}, backend={self._backend!r}, {state})"

    # ---------------------------------------------------------------- lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new World")

    def _start(self, *, wait: bool = True) -> None:
        import torch.distributed as dist

        self._tmpdir = Path(tempfile.mkdtemp(prefix=f"nemo_dist_world{self._size}_"))
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=datetime.timedelta(seconds=self._pg_timeout),
            wait_for_workers=False,
        )
        port = int(self._store.port)
        self._sent_path = list(sys.path)
        self._ready = False
        try:
            for rank in range(self._size):
                self._ranks.append(self._spawn(rank, port))
        except BaseException:
            self._shutdown(graceful=False)
            raise
        if wait:
            self._finish_start()

    def _finish_start(self) -> None:
        """Wait until every launched rank joined the group (or fail, leaving no process behind)."""
        try:
            self._await_ready()
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self._ready = True

    def _spawn(self, rank: int, port: int) -> _Rank:
        assert self._tmpdir is not None
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(self._size),
            LOCAL_WORLD_SIZE=str(self._size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        if sys.platform.startswith("linux"):
            env["GLOO_SOCKET_IFNAME"] = "lo"
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        stderr_path = self._tmpdir / f"rank{rank}.stderr"
        stack_path = self._tmpdir / f"rank{rank}.stack"
        ours, theirs = socket.socketpair()
        try:
            with stderr_path.open("wb") as err:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "nemo_dist.testing._rank",
                        str(theirs.fileno()),
                    ],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    env=env,
                )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        handle = _Rank(rank, proc, conn, _open_pidfd(proc.pid), stderr_path, stack_path)
        conn.send(
            _protocol.Init(
                rank=rank,
                world_size=self._size,
                backend=self._backend,
                store_port=port,
                pg_timeout_s=self._pg_timeout,
                sys_path=self._sent_path,
                parent_pid=os.getpid(),
                stack_file=str(stack_path),
                setup=self._setup,
            )
        )
        return handle

    def _await_ready(self) -> None:
        replies, deaths, pending, timed_out = self._gather(_STARTUP_SEQ, self._startup_timeout)
        context = f" while starting a {self._backend} world of {self._size}"
        if timed_out:
            raise WorldTimeout(self._startup_timeout, self._dump(pending), self._size, context)
        failures = self._failures(replies, deaths, pending)
        if failures:
            raise RankFailure(failures, {}, self._size, context)

    def _shutdown(self, graceful: bool) -> None:
        ranks, self._ranks = self._ranks, []
        self._ready = False
        if graceful:
            for r in ranks:
                with contextlib.suppress(OSError):
                    r.conn.send(_protocol.EXIT)
            self._wait_exit(ranks, _KILL_AFTER_S)
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
            r.conn.close()
            if r.pidfd is not None:
                os.close(r.pidfd)
        self._store = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _replace(self) -> None:
        """Discard the ranks (killed); the next run starts fresh ones."""
        self._shutdown(graceful=False)

    # ------------------------------------------------------------------- calls
    def _call(self, blob: bytes, deadline_s: float, name: str) -> list[Any]:
        self._seq += 1
        seq = self._seq
        path: list[str] | None = None
        if sys.path != self._sent_path:
            path = self._sent_path = list(sys.path)
        msg = pickle.dumps((_protocol.CALL, seq, blob, path), pickle.HIGHEST_PROTOCOL)
        for r in self._ranks:
            with contextlib.suppress(OSError):  # a dead rank is reported by _gather
                r.conn.send_bytes(msg)
        try:
            replies, deaths, pending, timed_out = self._gather(seq, deadline_s)
        except BaseException:  # interrupted (KeyboardInterrupt...): ranks are mid-call
            self._replace()
            raise
        if timed_out:
            stacks = self._dump(pending)
            self._replace()
            raise WorldTimeout(deadline_s, stacks, self._size, f" running {name}")
        if not deaths and not pending and all(isinstance(m, _protocol.Returned) for m in replies.values()):
            self._reemit_warnings([replies[r] for r in range(self._size)])
            return [replies[r].value for r in range(self._size)]
        failures = self._failures(replies, deaths, pending)
        returned = {r: m.value for r, m in replies.items() if isinstance(m, _protocol.Returned)}
        if deaths or pending or not self._verify():
            self._replace()
        raise RankFailure(failures, returned, self._size, f" running {name}")

    def _reemit_warnings(self, replies: list[Any]) -> None:
        """Emit here, once per distinct warning, what the ranks' call emitted.

        The parent's filters decide: under pytest's ``filterwarnings = error`` a
        rank's warning fails the test like one raised in the test itself.
        """
        distinct = dict.fromkeys(emitted for reply in replies for emitted in reply.warnings)
        for emitted in distinct:
            warnings.warn_explicit(
                emitted.message,
                _warning_category(emitted.category),
                emitted.filename,
                emitted.lineno,
                registry=self._warning_registry,
            )

    def _verify(self) -> bool:
        """True when every rank passes a barrier within a short deadline."""
        self._seq += 1
        seq = self._seq
        blob = pickle.dumps((_protocol.barrier, (), {}), pickle.HIGHEST_PROTOCOL)
        msg = pickle.dumps((_protocol.CALL, seq, blob, None), pickle.HIGHEST_PROTOCOL)
        for r in self._ranks:
            try:
                r.conn.send_bytes(msg)
            except OSError:
                return False
        replies, deaths, pending, _ = self._gather(seq, _VERIFY_DEADLINE_S)
        return not deaths and not pending and all(isinstance(m, _protocol.Returned) for m in replies.values())

    def _gather(self, seq: int, deadline_s: float) -> tuple[dict[int, Any], dict[int, str], set[int], bool]:
        """Collect one answer per rank for call ``seq``.

        Returns ``(replies, deaths, pending, timed_out)``: the answers by rank,
        the ranks that died with their exit description, the ranks that did not
        answer, and whether the deadline (rather than the post-failure grace)
        ended the wait.
        """
        end = time.monotonic() + deadline_s
        grace_end: float | None = None
        pending = set(range(len(self._ranks)))
        replies: dict[int, Any] = {}
        deaths: dict[int, str] = {}
        owner: dict[Any, int] = {}
        for r in self._ranks:
            for s in r.sentinels():
                owner[s] = r.rank
        while pending:
            limit = end if grace_end is None else min(end, grace_end)
            remaining = limit - time.monotonic()
            if remaining <= 0:
                break
            ready = wait([s for s, r in owner.items() if r in pending], remaining)
            for s in ready:
                rank = owner[s]
                if rank not in pending:
                    continue
                failed = self._receive(self._ranks[rank], seq, replies, deaths)
                if rank in replies or rank in deaths:
                    pending.discard(rank)
                if failed and grace_end is None:
                    grace_end = time.monotonic() + self._grace
        timed_out = bool(pending) and grace_end is None
        return replies, deaths, pending, timed_out

    def _receive(self, r: _Rank, seq: int, replies: dict[int, Any], deaths: dict[int, str]) -> bool:
        """Read what rank ``r`` has to say; return True if it failed."""
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
            if seq == _STARTUP_SEQ and isinstance(msg, _protocol.Ready):
                replies[r.rank] = msg
                return False
            if getattr(msg, "seq", None) != seq:
                continue  # a late answer to an earlier call
            replies[r.rank] = msg
            return isinstance(msg, _protocol.Raised)
        if eof or r.proc.poll() is not None or (r.pidfd is not None and wait([r.pidfd], 0)):
            # EOF or exit: the process is gone (or going).
            self._wait_exit([r], _KILL_AFTER_S)
            if r.proc.poll() is None:
                r.proc.kill()
            deaths[r.rank] = self._death_text(r)
            return True
        return False

    def _death_text(self, r: _Rank) -> str:
        code = r.proc.wait()
        tail = _tail(r.stderr_path).rstrip()
        text = f"rank {r.rank} died: {_exit_text(code)}"
        return f"{text}\n--- rank {r.rank} stderr (tail) ---\n{tail}" if tail else text

    def _failures(self, replies: dict[int, Any], deaths: dict[int, str], pending: set[int]) -> dict[int, str]:
        failures: dict[int, str] = dict(deaths)
        for rank, msg in replies.items():
            if isinstance(msg, _protocol.Raised):
                failures[rank] = f"rank {rank} raised {msg.exc_type}: {msg.message}\n{msg.traceback}"
        if pending:
            stacks = self._dump(pending)
            for rank in pending:
                failures[rank] = (
                    f"rank {rank} did not answer within {self._grace:g} s of the first "
                    f"failure; its stack:\n{stacks[rank]}"
                )
        return failures

    # ------------------------------------------------------------------ dumps
    def _wait_exit(self, ranks: list[_Rank], timeout: float) -> None:
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

    def _dump(self, ranks: set[int]) -> dict[int, str]:
        """SIGTERM the ranks (faulthandler dumps every thread), reap, return stacks."""
        targets = [self._ranks[r] for r in sorted(ranks)]
        for r in targets:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        self._wait_exit(targets, _KILL_AFTER_S)
        stacks: dict[int, str] = {}
        for r in targets:
            killed = r.proc.poll() is None
            if killed:
                r.proc.kill()
            r.proc.wait()
            try:
                stack = r.stack_path.read_text("utf-8", "replace").strip()
            except OSError:
                stack = ""
            if not stack:
                stack = "(no stack was dumped" + (
                    f"; killed with SIGKILL after {_KILL_AFTER_S:g} s)" if killed else ")"
                )
            tail = _tail(r.stderr_path, 1500).rstrip()
            if tail:
                stack += f"\n--- rank {r.rank} stderr (tail) ---\n{tail}"
            stacks[r.rank] = stack
        return stacks
