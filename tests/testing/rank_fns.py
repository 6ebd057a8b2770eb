"""Module-level functions the harness tests send to rank processes.

They live in an importable module (``tests.testing.rank_fns``) because a
World pickles functions by reference.
"""

from __future__ import annotations

import os
import signal
from typing import Any


def identity() -> tuple[int, int, int, dict[str, str]]:
    """Return rank, world size, torch threads and the rank's env vars."""
    import torch
    import torch.distributed as dist

    env = {k: os.environ.get(k, "") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return dist.get_rank(), dist.get_world_size(), torch.get_num_threads(), env


def all_gather_ranks(extra: float = 0.0) -> list[float]:
    """All-gather each rank's number plus ``extra``; return the gathered list."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([dist.get_rank() + extra])
    out = [torch.empty(1) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.item() for t in out]


def echo(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the arguments as received."""
    return args, kwargs


def add_rank(tensor: Any) -> Any:
    """Return ``tensor + rank`` (a tensor sent back by value)."""
    import torch.distributed as dist

    return tensor + dist.get_rank()


def raise_on(ranks: list[int]) -> int:
    """Raise ValueError on the given ranks, return the rank elsewhere."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank in ranks:
        raise ValueError(f"planted failure on rank {rank}")
    return rank


def raise_then_others_wait(rank_to_fail: int) -> None:
    """One rank raises while the others wait in an all_reduce forever."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == rank_to_fail:
        raise KeyError("planted")
    dist.all_reduce(torch.ones(1))


def hang_in_barrier(rank_to_hang: int) -> int:
    """One rank enters a barrier nobody else joins; the others return."""
    import torch.distributed as dist

    if dist.get_rank() == rank_to_hang:
        dist.barrier()
    return dist.get_rank()


def exit_with(rank_to_exit: int, code: int) -> None:
    """One rank writes a last word to stderr and calls ``os._exit(code)``; the others wait in a barrier."""
    import sys

    import torch.distributed as dist

    if dist.get_rank() == rank_to_exit:
        print(f"last words of rank {rank_to_exit}", file=sys.stderr, flush=True)
        os._exit(code)
    dist.barrier()


def kill_self(rank_to_die: int) -> None:
    """One rank SIGKILLs itself; the others wait in a barrier."""
    import torch.distributed as dist

    if dist.get_rank() == rank_to_die:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def unpicklable_result() -> Any:
    """Return something pickle refuses (a lock)."""
    import threading

    return threading.Lock()


class PlantedWarning(UserWarning):
    """A warning class of the test module, to check categories travel by name."""


def warn_on(ranks: list[int]) -> int:
    """Emit a PlantedWarning on the given ranks, return the rank."""
    import warnings

    import torch.distributed as dist

    rank = dist.get_rank()
    if rank in ranks:
        warnings.warn("planted warning from a rank", PlantedWarning, stacklevel=1)
    return rank


_SET_UP: list[int] = []


def remember_setup() -> None:
    """A World ``setup``: record, in this rank process, that it ran (with the rank)."""
    import torch.distributed as dist

    _SET_UP.append(dist.get_rank())


def setup_record() -> list[int]:
    """What :func:`remember_setup` recorded in this rank process."""
    return list(_SET_UP)


def failing_setup() -> None:
    """A World ``setup`` that fails on rank 1."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("setup cannot run here")


def compute_for(seconds: float) -> int:
    """Keep the CPU busy for ``seconds`` (pure Python: the stack barely changes), then return the rank."""
    import time

    import torch.distributed as dist

    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return dist.get_rank()


def wait_for_busy_rank(busy_rank: int, seconds: float) -> int:
    """Rank ``busy_rank`` computes for ``seconds`` of CPU time, then every rank meets in a barrier."""
    import torch.distributed as dist

    if dist.get_rank() == busy_rank:
        compute_for(seconds)
    dist.barrier()
    return dist.get_rank()


def refuse_after_computing(busy_rank: int, seconds: float) -> int:
    """Every rank raises the same ValueError, rank ``busy_rank`` only after computing for ``seconds`` of CPU time (as
    a rank still importing a model refuses what the others already refused)."""
    import torch.distributed as dist

    if dist.get_rank() == busy_rank:
        compute_for(seconds)
    raise ValueError("refused alike")


def wait_for_busy_subprocess(busy_rank: int, seconds: float) -> int:
    """Rank ``busy_rank`` waits on a subprocess that computes for ``seconds`` of CPU time (as torch waits on a
    compiler it started), then every rank meets in a barrier."""
    import subprocess
    import sys

    import torch.distributed as dist

    if dist.get_rank() == busy_rank:
        busy = f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end:\n    pass\n"
        subprocess.run([sys.executable, "-c", busy], check=True)
    dist.barrier()
    return dist.get_rank()


def churn_threads(seconds: float) -> int:
    """Start and join short-lived threads, from three threads at once, for ``seconds``; return the thread count.

    The pattern (threads coming and going while Python frames change) under
    which a stack dump written from inside a signal handler, as faulthandler
    writes one, reads freed frames and crashes the process.
    """
    import threading
    import time

    def depth(n: int) -> int:
        return 0 if n == 0 else depth(n - 1) + 1

    started = [0]
    end = time.monotonic() + seconds

    def churn() -> None:
        while time.monotonic() < end:
            thread = threading.Thread(target=depth, args=(50,))
            thread.start()
            thread.join()
            started[0] += 1

    workers = [threading.Thread(target=churn) for _ in range(3)]
    for worker in workers:
        worker.start()
    while time.monotonic() < end:
        depth(200)
    for worker in workers:
        worker.join()
    return started[0]


def origin(name: str) -> tuple[int, str | None, str]:
    """The rank's parent pid, its value of environment variable ``name``, and torch.distributed's debug level."""
    import torch.distributed as dist

    return os.getppid(), os.environ.get(name), str(dist.get_debug_level())


def preloaded_importer() -> tuple[int, int, int]:
    """(pid of the process that imported ``tests.testing._preloaded``, this rank's pid, its parent's pid)."""
    from tests.testing import _preloaded

    return _preloaded.IMPORTED_BY, os.getpid(), os.getppid()
