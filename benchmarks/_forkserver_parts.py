"""The parts of ``forkserver.py`` that run in its child processes, and its process helpers.

Children of either fork server call these functions by reference
(``_forkserver_parts.barrier``), so they live in a module both the harness's
ranks and the stdlib forkserver can import: this directory is on their path.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import multiprocessing
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

__all__ = [
    "DEADLINE_S",
    "DEBUG_VAR",
    "PROBE_VAR",
    "STDLIB_PRELOAD",
    "announce_and_sleep",
    "barrier",
    "become_subreaper",
    "die_by_signal",
    "environment",
    "environment_probe",
    "exit_via_os",
    "exit_via_sys",
    "free_port",
    "has_module",
    "is_alive",
    "kill_and_reap",
    "parent_pid_of",
    "read_line",
    "run_stdlib_child",
    "send_result",
    "stdlib_context",
    "stdlib_environment_probe",
    "stdlib_rank",
    "stop_stdlib_helpers",
    "wait_for_messages",
]

#: What the stdlib forkserver imports once (the issue's list).
STDLIB_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel"]
#: A variable no one reads at import time, set in the parent after the servers started.
PROBE_VAR = "NEMO_DIST_BENCH_PROBE"
#: A variable torch reads when ``torch.distributed`` is imported, set after the servers started.
DEBUG_VAR = "TORCH_DISTRIBUTED_DEBUG"
#: Bound on any one wait for child processes (a cold server start on a loaded machine is slow).
DEADLINE_S = 120.0
_PR_SET_CHILD_SUBREAPER = 36


# ------------------------------------------------------------------ run in the children
def barrier() -> int:
    """Pass one barrier of the default group; return this rank."""
    import torch.distributed as dist

    dist.barrier()
    return dist.get_rank()


def environment_probe() -> dict[str, Any]:
    """What this process sees: the probe variable, TORCH_DISTRIBUTED_DEBUG and torch's debug level, its parent."""
    import torch.distributed as dist

    return {
        "probe": os.environ.get(PROBE_VAR),
        "debug_env": os.environ.get(DEBUG_VAR),
        "debug_level": dist.get_debug_level().name,
        "server": os.getppid(),
    }


def has_module(name: str) -> bool:
    """Whether module ``name`` was imported in this process before this call (inherited from the server)."""
    return name in sys.modules


def die_by_signal(signum: int) -> None:
    """Send ``signum`` to this process (it dies of it before the bounded sleep ends)."""
    os.kill(os.getpid(), signum)
    time.sleep(DEADLINE_S)


def exit_via_sys(code: int) -> None:
    """``sys.exit(code)``: a SystemExit exception."""
    sys.exit(code)


def exit_via_os(code: int) -> None:
    """``os._exit(code)``: the process ends at once with ``code``."""
    os._exit(code)


def announce_and_sleep(marker_dir: str, seconds: float) -> None:
    """Write a file named after this pid in ``marker_dir``, then sleep ``seconds``."""
    Path(marker_dir, str(os.getpid())).write_text("")
    time.sleep(seconds)


def stdlib_rank(rank: int, size: int, port: int, conn: Connection) -> None:
    """A stdlib-forkserver rank: join a gloo group through env://, pass a barrier, say "joined", leave."""
    import torch
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        TORCHELASTIC_USE_AGENT_STORE="True",  # the store is the parent's: every rank is its client
    )
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=DEADLINE_S)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size, timeout=timeout)
    dist.barrier()
    conn.send("joined")
    conn.close()
    dist.destroy_process_group()


def stdlib_environment_probe(env: dict[str, str]) -> dict[str, Any]:
    """What this process inherited, then torch's debug level after it took ``env`` and joined a 1-rank group."""
    import torch.distributed as dist

    inherited = {"probe": os.environ.get(PROBE_VAR), "debug_env": os.environ.get(DEBUG_VAR)}
    os.environ.update(env)  # the workaround: the parent passes the variables itself
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    after = dist.get_debug_level().name
    dist.destroy_process_group()
    return {**inherited, "debug_level": after, "server": os.getppid()}


def send_result(conn: Connection, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` and send its value over ``conn``."""
    conn.send(fn(*args))


# ------------------------------------------------------------------ process helpers
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parent_pid_of(pid: int) -> int:
    """The parent pid of process ``pid``, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def is_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (an exited, unreaped process counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def become_subreaper() -> None:
    """Have orphaned descendants reparented to this process, so that it can reap them (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_and_reap(pids: list[int], timeout: float = 10.0) -> None:
    """SIGKILL each of ``pids`` still alive, then reap those that are this process's children (bounded)."""
    for pid in pids:
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    pending = list(pids)
    while pending and time.monotonic() < end:
        still = []
        for pid in pending:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (or already reaped): nothing to do
                continue
            if done == 0:
                still.append(pid)
        pending = still
        if pending:
            time.sleep(0.05)


def wait_for_messages(readers: list[Connection], deadline: float) -> None:
    """Receive one message from each of ``readers`` before ``deadline`` (monotonic); raise on EOF or timeout."""
    pending = list(readers)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(pending)} child(ren) did not report in time")
        for conn in wait(pending, remaining):
            conn.recv()  # EOFError: the child died before it reported
            pending.remove(conn)


@contextlib.contextmanager
def environment(**variables: str) -> Iterator[None]:
    """Set ``variables`` in this process's environment for the block, then restore it."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stdlib_context() -> Any:
    """The forkserver context with the issue's preload list (the server itself starts on first use)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(STDLIB_PRELOAD)
    return ctx


def run_stdlib_child(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a process of the stdlib forkserver; return its value."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=send_result, args=(writer, fn, *args), daemon=True)
    proc.start()
    writer.close()
    try:
        if not reader.poll(DEADLINE_S):
            raise TimeoutError(f"{fn.__name__} did not answer within {DEADLINE_S:g} s")
        return reader.recv()
    finally:
        reader.close()
        proc.join(DEADLINE_S)
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def stop_stdlib_helpers() -> None:
    """Stop this process's stdlib forkserver and resource tracker now, and wait for them (private, test-only API)."""
    from multiprocessing import forkserver, resource_tracker

    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()


def read_line(stream: Any, deadline: float) -> bytes:
    """One line from the binary pipe ``stream`` before ``deadline`` (monotonic); raise TimeoutError."""
    data = b""
    fd = stream.fileno()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
        if not ready:
            raise TimeoutError("the parent of the cleanup test did not report its pids")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise EOFError("the parent of the cleanup test exited before it reported its pids")
        data += chunk
    return data
