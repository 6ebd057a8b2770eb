"""Persistent multi-process worlds for tests (parent side of the harness).

A :class:`World` owns ``size`` rank processes joined in one
``torch.distributed`` default group. They start on the first run and serve
every later run, so a call costs a few milliseconds instead of a process start.
The parent talks to each rank through a private socket pair carrying pickled
messages (:mod:`._protocol`); it rendezvous the ranks through a TCPStore it
hosts on 127.0.0.1 with an OS-assigned port. The rank processes themselves
are :mod:`.processes`' business, pickling a call and gathering its answers
:mod:`.calls`'. This module imports no torch at load time.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import pickle
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_dist.testing import _protocol, launcher, processes
from nemo_dist.testing._errors import (
    FunctionNotPicklable,
    RankFailure,
    WorldError,
    WorldTimeout,
)
from nemo_dist.testing.calls import STARTUP_SEQ, describe, gather, pickle_call, warning_category
from nemo_dist.testing.progress import ProgressWatch

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FunctionNotPicklable", "RankFailure", "World", "WorldError", "WorldTimeout"]

_VERIFY_DEADLINE_S = 5.0


class World:
    """A persistent world of ``size`` rank processes for tests.

    ``backend`` is the torch.distributed backend of the default group ("gloo"
    on CPU, "nccl" with one GPU per rank). ``timeout`` is the default deadline
    of one :meth:`run` in seconds. ``grace`` is how long the other ranks get to
    answer once one rank failed. ``startup_timeout`` bounds starting the ranks.
    ``setup`` (a module-level function, no arguments) runs once on every rank
    after it joined the group and before it reports ready, at every start:
    warm-up work (first imports, a first DDP) that a background
    ``start(wait=False)`` then does while the caller goes on. ``preload``
    names modules the ranks will import (``transformers``, say): where ranks
    are forked from the fork server, it imports them once and every rank of
    every World inherits them, instead of each rank importing them anew.
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
        preload: Sequence[str] = (),
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
        self._setup = None if setup is None else pickle_call(setup, (), {})
        if isinstance(preload, str) or not all(isinstance(name, str) for name in preload):
            raise ValueError(f"World preload must be a sequence of module names, got {preload!r}")
        self._preload = tuple(preload)
        self._size = size
        self._backend = backend
        self._timeout = float(timeout)
        self._grace = float(grace)
        self._startup_timeout = float(startup_timeout)
        # Children's process-group timeout outlives any parent deadline, so the
        # parent reports first.
        self._pg_timeout = max(2 * self._timeout, self._timeout + 60.0, self._startup_timeout)
        self._ranks: list[processes.RankProcess] = []
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
        return self._run(deadline_s, None, fn, args, kwargs)

    def run_patiently(
        self, deadline_s: float, limit_s: float, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        """Like :meth:`run_with_deadline`, but a call that is slow rather than stuck gets time, up to ``limit_s``.

        Past ``deadline_s`` the unfinished ranks are probed every second
        (:class:`~nemo_dist.testing.progress.ProgressWatch`): the call goes on
        while any of them is working (running, its stack changing, using CPU:
        importing, compiling, computing) and ends in WorldTimeout when every
        one of them is blocked (asleep with the same stack and no CPU time over
        a probe interval: waiting in a collective or a receive), or at
        ``limit_s`` seconds. The timeout's ``reason`` says which.
        """
        if not limit_s >= deadline_s:
            raise ValueError(f"limit_s must be >= deadline_s ({deadline_s!r} s), got {limit_s!r}")
        return self._run(deadline_s, float(limit_s), fn, args, kwargs)

    def _run(
        self,
        deadline_s: float,
        limit_s: float | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> list[Any]:
        """Validate, pickle, start if needed and call: what every run method shares."""
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}")
        self._check_open()
        blob = pickle_call(fn, args, kwargs)
        self.start()
        return self._call(blob, float(deadline_s), describe(fn), limit_s=limit_s)

    def close(self) -> None:
        """Stop the ranks and free every resource; idempotent.

        Ranks are asked to leave the group and exit, stragglers are killed after
        a few seconds, then the TCPStore and the private temp dir are removed.
        A rank that outlives SIGKILL for 10 s (stuck in the kernel) is left
        running and named in a RuntimeWarning; close never blocks on it.
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

    def _spawn(self, rank: int, port: int) -> processes.RankProcess:
        assert self._tmpdir is not None
        handle = launcher.spawn_rank(rank, self._size, port, self._tmpdir, self._preload)
        handle.conn.send(
            _protocol.Init(
                rank=rank,
                world_size=self._size,
                backend=self._backend,
                store_port=port,
                pg_timeout_s=self._pg_timeout,
                sys_path=self._sent_path,
                parent_pid=os.getpid(),
                stack_file=str(handle.stack_path),
                setup=self._setup,
                sample_file=str(handle.sample_path or ""),
            )
        )
        return handle

    def _await_ready(self) -> None:
        replies, deaths, pending, timed_out = self._gather(STARTUP_SEQ, self._startup_timeout)
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
            processes.wait_exit(ranks, processes.KILL_AFTER_S)
        left = [r for r in ranks if not processes.reap(r)]
        self._store = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        if left:  # warned last: under warnings-as-errors the cleanup above still happened
            warnings.warn(processes.left_running_text(left), RuntimeWarning, stacklevel=3)

    def _replace(self) -> None:
        """Discard the ranks (killed); the next run starts fresh ones."""
        self._shutdown(graceful=False)

    # ------------------------------------------------------------------- calls
    def _call(self, blob: bytes, deadline_s: float, name: str, *, limit_s: float | None = None) -> list[Any]:
        self._seq += 1
        seq = self._seq
        path: list[str] | None = None
        if sys.path != self._sent_path:
            path = self._sent_path = list(sys.path)
        msg = pickle.dumps((_protocol.CALL, seq, blob, path), pickle.HIGHEST_PROTOCOL)
        for r in self._ranks:
            with contextlib.suppress(OSError):  # a dead rank is reported by _gather
                r.conn.send_bytes(msg)
        watch = None if limit_s is None else ProgressWatch(self._ranks)
        started = time.monotonic()
        try:
            replies, deaths, pending, timed_out = self._gather(seq, deadline_s, watch=watch, limit_s=limit_s)
        except BaseException:  # interrupted (KeyboardInterrupt...): ranks are mid-call
            self._replace()
            raise
        if timed_out:
            waited = time.monotonic() - started
            stacks = self._dump(pending)
            self._replace()
            reason = ""
            if watch is not None:
                ended = watch.verdict or f"still working at the {limit_s:g} s limit"
                reason = f"{ended}; waited {waited:.1f} s in all"
            raise WorldTimeout(deadline_s, stacks, self._size, f" running {name}", reason)
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
                warning_category(emitted.category),
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

    def _gather(
        self, seq: int, deadline_s: float, *, watch: ProgressWatch | None = None, limit_s: float | None = None
    ) -> tuple[dict[int, Any], dict[int, str], set[int], bool]:
        """Collect one answer per rank for call ``seq`` (see :func:`.calls.gather`)."""
        return gather(self._ranks, seq, deadline_s, self._grace, watch=watch, limit_s=limit_s)

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

    def _dump(self, ranks: set[int]) -> dict[int, str]:
        """SIGTERM the ranks (faulthandler dumps every thread), reap, return stacks."""
        return processes.dump_stacks([self._ranks[r] for r in sorted(ranks)])
