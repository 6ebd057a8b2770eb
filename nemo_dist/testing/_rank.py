"""Rank process main loop (child side of the harness).

Started by :class:`nemo_dist.testing.World` (see :mod:`.launcher`): forked
from the fork server (:mod:`._zygote`), or as ``python -m
nemo_dist.testing._rank FD``, where ``FD`` is this rank's end of a private
socket pair. The loop receives an :class:`~._protocol.Init`, joins the
process group through the parent's TCPStore, answers :class:`~._protocol.Ready`,
then runs one call per message until it gets ``EXIT`` or the pipe hits EOF.
This module imports nothing from the parent side.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import inspect
import os
import pickle
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import IO, Any

from nemo_dist.testing._gloo_device import share_one_device
from nemo_dist.testing._protocol import CALL, Init, Raised, RankWarning, Ready, Returned, dumps
from nemo_dist.testing._stack_sampler import block_probe_signal, start_stack_sampler

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the parent thread exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _set_path(parent_path: list[str]) -> None:
    """Make imports resolve as in the parent: its path first, ours after."""
    extra = [p for p in sys.path if p not in parent_path]
    sys.path[:] = [*parent_path, *extra]


def _raised(seq: int, rank: int, exc: BaseException) -> Raised:
    return Raised(
        seq=seq,
        rank=rank,
        exc_type=type(exc).__qualname__,
        message=str(exc),
        traceback=traceback.format_exc(),
    )


def _as_rank_warning(caught: warnings.WarningMessage) -> RankWarning:
    category = caught.category
    return RankWarning(
        str(caught.message), f"{category.__module__}:{category.__qualname__}", caught.filename, caught.lineno
    )


def _answer(seq: int, rank: int, blob: bytes) -> bytes:
    """Run one call and return the pickled reply (never raises).

    Warnings the call emits are recorded, not printed, and travel with the
    result, so the parent's filters (pytest's warnings-as-errors) judge them.
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn, args, kwargs = pickle.loads(blob)
            value: Any = fn(*args, **kwargs)
    except BaseException as exc:
        return dumps(_raised(seq, rank, exc))
    emitted = tuple(dict.fromkeys(_as_rank_warning(w) for w in caught))
    try:
        return dumps(Returned(seq, rank, value, emitted))
    except BaseException as exc:
        reply = _raised(seq, rank, exc)
        reply = Raised(
            seq,
            rank,
            reply.exc_type,
            f"the return value could not be pickled: {reply.message}",
            reply.traceback,
        )
        return dumps(reply)


def _device_id_kwargs(init_process_group: Callable[..., Any], device: Any) -> dict[str, Any]:
    """``{"device_id": device}`` where ``init_process_group`` accepts it (torch >= 2.3), else ``{}``.

    With a device id NCCL creates the communicator inside ``init_process_group``,
    so a GPU world that cannot talk fails at its start, not in a test.
    """
    if device is None:
        return {}
    try:
        parameters = inspect.signature(init_process_group).parameters
    except (TypeError, ValueError):  # pragma: no cover - no signature to inspect
        return {}
    return {"device_id": device} if "device_id" in parameters else {}


def _join(init: Init) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    share_one_device()  # one gloo I/O thread per rank, not one per group (see _gloo_device)
    device = None
    if init.backend == "nccl":
        index = init.rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    timeout = datetime.timedelta(seconds=init.pg_timeout_s)
    store = dist.TCPStore("127.0.0.1", init.store_port, is_master=False, timeout=timeout)
    dist.init_process_group(
        init.backend,
        store=store,
        rank=init.rank,
        world_size=init.world_size,
        timeout=timeout,
        **_device_id_kwargs(dist.init_process_group, device),
    )


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None, *, parent_pid: int | None = None) -> int:
    """Serve calls from the parent until told to exit; return the exit status.

    ``parent_pid``: the process whose death must kill this one (default: the
    World's process, named in the Init).
    """
    args = sys.argv[1:] if argv is None else argv
    block_probe_signal()  # before any thread exists: only the stack sampler may take a probe
    conn = Connection(int(args[0]))
    try:
        init: Init = conn.recv()
    except EOFError:
        return 0
    die_with_parent(init.parent_pid if parent_pid is None else parent_pid)
    stack_file: IO[str] = open(init.stack_file, "w")  # noqa: SIM115 - lives as long as the process
    # A rank killed by a fatal signal (SIGSEGV, SIGABRT) writes its Python stack to stderr, whose
    # tail the parent reports with the crash.
    faulthandler.enable(file=sys.stderr, all_threads=False)
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)
    if init.sample_file:
        # Progress probes: the parent asks for a dump while a call outlives its
        # deadline, to tell a blocked rank from a busy one (see progress.py).
        # Not faulthandler's: its dump, written in the signal handler, can crash
        # the rank (see _stack_sampler).
        sample_file: IO[str] = open(init.sample_file, "a")  # noqa: SIM115 - lives as long as the process
        start_stack_sampler(sample_file)
    _set_path(init.sys_path)
    try:
        _join(init)
        if init.setup is not None:
            fn, args, kwargs = pickle.loads(init.setup)
            fn(*args, **kwargs)
    except BaseException as exc:
        conn.send(_raised(-1, init.rank, exc))
        return 1
    conn.send(Ready(init.rank))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] != CALL:
            break
        _, seq, blob, sys_path = msg
        if sys_path is not None:
            _set_path(sys_path)
        conn.send_bytes(_answer(seq, init.rank, blob))
    _leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
