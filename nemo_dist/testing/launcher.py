"""How a World's rank processes start: forked from a fork server that imported torch once, or executed afresh.

Importing torch costs a new interpreter about 1.5 s of CPU (far more on a
busy machine), and every rank of every world used to pay it. On Linux each
rank is now forked from a fork server (:mod:`._zygote`), started on first use
by the parent process, which imported torch, ``torch.distributed``, DDP and
the rank loop once: a rank then costs a fork and its process-group join. The
server is single-threaded and never initialises CUDA, so NCCL ranks forked
from it may. Each rank takes the parent's environment of the moment it is
started as its whole environment, writes its stdout and stderr to its own
file, and dies with the server, which dies with the parent. What torch and
Python read when they start is the server's: so a parent has one server per
set of such variables (``TORCH*``, ``PYTORCH*``, ``OMP_*``, ``MKL_*``,
``KMP_*``, ``PYTHON*``; a World started under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
gets a server of its own), and past three such sets a rank is executed
afresh, so that every rank starts as it would alone.

With ``NEMO_DIST_RANK_START=exec`` (the fallback where there is no
``os.fork``, and the baseline of ``benchmarks/harness.py``) each rank is
``python -m nemo_dist.testing._rank`` as before. Either way the World gets
a :class:`~.processes.RankProcess` whose ``proc`` has ``subprocess.Popen``'s
interface (pid, poll, wait, kill, send_signal): a forked rank's exit status
comes from the server, which reaps it. This module imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO

from nemo_dist.testing._errors import WorldError
from nemo_dist.testing.processes import RankProcess, open_pidfd

__all__ = [
    "IMPORT_TIME_PREFIXES",
    "RANK_START_ENV",
    "ForkedProcess",
    "in_env_world",
    "rank_start_method",
    "spawn_rank",
    "start_fork_server",
]

#: Environment variable choosing how ranks start: "forkserver" (the default where available) or "exec".
RANK_START_ENV = "NEMO_DIST_RANK_START"
#: Prefixes of the environment variables torch or Python may read when they start (not later).
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "PYTHON")
#: Seconds the fork server gets to import torch and answer (a cold start on a loaded machine is slow).
_SERVER_START_S = 300.0
_MAX_MESSAGE = 1 << 20
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def rank_start_method() -> str:
    """"forkserver" or "exec": ``NEMO_DIST_RANK_START`` when set, else forkserver where ``os.fork`` exists.

    Raises ``ValueError`` naming the variable for any other value.
    """
    wanted = os.environ.get(RANK_START_ENV, "").strip()
    if wanted not in ("", "forkserver", "exec"):
        raise ValueError(f"{RANK_START_ENV} expects forkserver or exec; got {wanted!r}")
    if wanted == "forkserver" or (not wanted and hasattr(os, "fork") and hasattr(socket, "send_fds")):
        return "forkserver"
    return "exec"


class _ForkServer:
    """The parent's side of its fork server: start it, ask it for ranks, collect their exit statuses."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._lock = threading.RLock()
        self._control: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._exits: dict[int, int] = {}
        self._ready = False
        self._log: IO[bytes] | None = None
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the server (its remaining ranks die with it); the next fork starts a new one."""
        with self._lock:
            self._close()

    def launch(self, preload: Sequence[str] = ()) -> None:
        """Start the server process now if it is not running, without waiting for it to import torch.

        It then imports the modules of ``preload`` too (before it forks any rank).
        """
        with self._lock:
            if self._control is None:
                self._launch()
            if preload:
                assert self._control is not None
                with contextlib.suppress(OSError):  # a dead server is found, and restarted, by the next fork
                    self._control.send(pickle.dumps(("preload", list(preload))))

    def _launch(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self._env)
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would make the server fork threaded
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - kept open until the server answers; read if it fails
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "nemo_dist.testing._zygote", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                env=env,
            )
        finally:
            theirs.close()
        self._control = ours
        self._ready = False

    def _start(self) -> socket.socket:
        """The control socket of a server that answered "ready" (launched first where it is not running)."""
        if self._control is None:
            self._launch()
        assert self._control is not None
        if self._ready:
            return self._control
        assert self._log is not None
        try:
            message = self._receive(_SERVER_START_S)
        except (OSError, EOFError, TimeoutError) as exc:
            self._log.seek(0)
            tail = self._log.read()[-4000:].decode("utf-8", "replace")
            self._close()
            raise WorldError(f"the fork server of the ranks did not start ({exc}):\n{tail}") from None
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        assert message[0] == "ready", message
        self._ready = True
        return self._control

    def _close(self) -> None:
        if not self._ready and self._proc is not None:
            self._proc.kill()  # still importing, no rank of its own yet: nothing to wait for
        self._ready = False
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._control is not None:
            self._control.close()  # the server sees EOF and exits
            self._control = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(10)
            self._proc = None

    def _receive(self, timeout: float | None) -> tuple[object, ...]:
        """The next message from the server that is not an exit status (those are filed); EOFError when it is gone."""
        assert self._control is not None
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if end is None else max(0.0, end - time.monotonic())
            ready, _, _ = select.select([self._control], [], [], remaining)
            if not ready:
                raise TimeoutError(f"no answer within {timeout:g} s")
            payload = self._control.recv(_MAX_MESSAGE)
            if not payload:
                raise EOFError("the fork server exited")
            message = pickle.loads(payload)
            if message[0] == "exit":
                self._exits[message[1]] = message[2]
            else:
                return tuple(message)

    def fork(self, theirs: socket.socket, env: dict[str, str], stderr_path: Path, preload: Sequence[str] = ()) -> int:
        """Fork a rank serving ``theirs`` (sent as a file descriptor); its pid. Starts the server on first use.

        The server imports the modules of ``preload`` it lacks before it forks (once per server).
        """
        with self._lock:
            for attempt in (1, 2):
                self._start()
                assert self._control is not None
                try:
                    request = pickle.dumps(("spawn", env, str(stderr_path), list(preload)))
                    socket.send_fds(self._control, [request], [theirs.fileno()])
                    kind, pid = self._receive(_SERVER_START_S)
                except (OSError, EOFError, TimeoutError):
                    self._close()  # a dead server: one fresh start, then give up
                    if attempt == 2:
                        raise
                    continue
                assert kind == "pid"
                self._exits.pop(int(pid), None)  # type: ignore[call-overload]  # an earlier rank's, if the pid came round
                return int(pid)  # type: ignore[call-overload]
            raise AssertionError("unreachable")

    def returncode(self, pid: int, timeout: float = 0.0) -> int | None:
        """The exit status of rank ``pid`` once the server reported it, waiting at most ``timeout`` seconds."""
        end = time.monotonic() + timeout
        with self._lock:
            while pid not in self._exits and self._control is not None:
                remaining = end - time.monotonic()
                try:
                    ready, _, _ = select.select([self._control], [], [], max(0.0, remaining))
                    if not ready:
                        return None
                    payload = self._control.recv(_MAX_MESSAGE)
                except OSError:
                    payload = b""
                if not payload:  # the server is gone, and with it its ranks (their exit status with it)
                    self._close()
                    break
                message = pickle.loads(payload)
                if message[0] == "exit":
                    self._exits[message[1]] = message[2]
            return self._exits.get(pid, -signal.SIGKILL if self._control is None else None)


def _import_time(env: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONPATH")


#: This process's fork servers, one per set of start-time variables (almost always one).
_SERVERS: dict[frozenset[tuple[str, str]], _ForkServer] = {}
#: More distinct start-time environments than this, and ranks are executed afresh.
_MAX_SERVERS = 3


def _server_for(env: dict[str, str]) -> _ForkServer | None:
    """The fork server started with ``env``'s start-time variables (made on first use), or None past the limit."""
    key = _import_time(env)
    if key not in _SERVERS and len(_SERVERS) >= _MAX_SERVERS:
        return None
    return _SERVERS.setdefault(key, _ForkServer(env))


#: The variables of an env:// world (torchrun's): a process with all of them set is a rank already.
_ENV_WORLD_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def in_env_world(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment describes an env:// world (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` all set)."""
    env = os.environ if environ is None else environ
    return all(env.get(name) for name in _ENV_WORLD_VARS)


def start_fork_server(preload: Sequence[str] = ()) -> None:
    """Start the fork server for this process's environment now, in the background (not under exec).

    Its imports (torch, then the modules of ``preload``) overlap with the
    caller's own work; the first World's ranks wait for them as they would
    have. A command that starts Worlds later calls this first thing.
    """
    if rank_start_method() != "forkserver":
        return
    server = _server_for(_rank_env(0, 1, 0))
    if server is not None:
        server.launch(preload)


class ForkedProcess:
    """``subprocess.Popen``'s interface over a rank forked by the fork server.

    The server, the rank's parent, reaps it and reports its exit status
    (negative: the signal that killed it, as Popen's ``returncode``).
    """

    def __init__(self, server: _ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the rank exited (and the server reported it), else None."""
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; raise ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, 1e9 if timeout is None else timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the rank, unless its exit was already reported."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not yet reported
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the rank."""
        self.send_signal(signal.SIGKILL)


def _rank_env(rank: int, world_size: int, store_port: int) -> dict[str, str]:
    """This process's environment with the rank's torch.distributed variables and the package importable."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store_port),
    )
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _exec(theirs: socket.socket, env: dict[str, str], stderr_path: Path) -> subprocess.Popen[bytes]:
    with stderr_path.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "nemo_dist.testing._rank", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=env,
        )


def spawn_rank(
    rank: int, world_size: int, store_port: int, tmpdir: Path, preload: Sequence[str] = ()
) -> RankProcess:
    """Start the process of ``rank`` with its stderr, stack and sample files in ``tmpdir``.

    Forked from the fork server or executed afresh (:func:`rank_start_method`);
    a forked rank inherits the modules of ``preload``, imported once by the
    server (an executed rank imports them when it first needs them).
    The process waits for its :class:`~._protocol.Init` on the returned
    handle's ``conn``; the caller sends it.
    """
    env = _rank_env(rank, world_size, store_port)
    stderr_path = tmpdir / f"rank{rank}.stderr"
    ours, theirs = socket.socketpair()
    try:
        proc: ForkedProcess | subprocess.Popen[bytes]
        server = _server_for(env) if rank_start_method() == "forkserver" else None
        if server is not None:
            proc = ForkedProcess(server, server.fork(theirs, env, stderr_path, preload))
        else:
            proc = _exec(theirs, env, stderr_path)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    stack_path, sample_path = tmpdir / f"rank{rank}.stack", tmpdir / f"rank{rank}.sample"
    return RankProcess(rank, proc, conn, open_pidfd(proc.pid), stderr_path, stack_path, sample_path)
