"""Cost of one harness call: persistent World vs fresh world vs a bare floor.

Run ``python benchmarks/harness.py [--iterations N] [--fresh N]``. For a tiny
all-gather (4 floats) in a 3-rank gloo world it measures

1. ``World.run`` on a persistent World (median over many calls);
2. a fresh world per call (start World, run, close), the way
   ``torch.testing._internal.common_distributed.MultiProcessTestCase`` starts
   processes per test: with ranks forked from the fork server (the default)
   and with ranks executed afresh (``NEMO_DIST_RANK_START=exec``, the way every
   rank started before the fork server), side by side;
3. the floor: 3 bare, already initialised processes connected by pipes, each
   doing the same all-gather when told and replying (no harness at all);

and prints ms per call with the ratios. Goals: persistent under 6 ms, within
1.5x of the floor, over 300x cheaper than a fresh start of executed ranks
(a process start per test); and how much cheaper the fork server makes a
world's start than executing its ranks.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

SIZE = 3

_FLOOR_CHILD = r"""
import os, sys, datetime
from multiprocessing.connection import Connection
import torch, torch.distributed as dist
torch.set_num_threads(1)
conn = Connection(int(sys.argv[1]))
rank, size, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = datetime.timedelta(seconds=300)
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=t)
conn.send_bytes(b"ready")
while conn.recv_bytes() == b"go":
    mine = torch.full((4,), float(rank))
    out = [torch.empty(4) for _ in range(size)]
    dist.all_gather(out, mine)
    conn.send(torch.stack(out).sum().item())
dist.destroy_process_group()
"""


def tiny_all_gather() -> float:
    """All-gather 4 floats per rank; return the sum of the gathered values."""
    import torch
    import torch.distributed as dist

    mine = torch.full((4,), float(dist.get_rank()))
    out = [torch.empty(4) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return float(torch.stack(out).sum().item())


def _median_ms(fn: object, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def persistent(iterations: int) -> float:
    """Median ms of World.run on a persistent 3-rank world."""
    from nemo_dist.testing import World

    with World(SIZE) as world:
        world.run(tiny_all_gather)  # start + warm up
        for _ in range(20):
            world.run(tiny_all_gather)
        return _median_ms(lambda: world.run(tiny_all_gather), iterations)


def fresh(iterations: int, start_method: str = "forkserver") -> float:
    """Median ms of start World + run + close, its ranks started by ``start_method`` (forkserver or exec)."""
    from nemo_dist.testing import World
    from nemo_dist.testing.launcher import RANK_START_ENV

    def once() -> None:
        with World(SIZE) as world:
            world.run(tiny_all_gather)

    previous = os.environ.get(RANK_START_ENV)
    os.environ[RANK_START_ENV] = start_method
    try:
        once()  # the fork server's own start is paid once per process, not per world
        return _median_ms(once, iterations)
    finally:
        if previous is None:
            del os.environ[RANK_START_ENV]
        else:
            os.environ[RANK_START_ENV] = previous


def floor(iterations: int) -> float:
    """Median ms of the same all-gather in bare pipe-driven processes."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False)
    procs, conns = [], []
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    for rank in range(SIZE):
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-c", _FLOOR_CHILD, str(theirs.fileno()), str(rank), str(SIZE), str(store.port)]
        procs.append(subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=env))
        theirs.close()
        conns.append(Connection(ours.detach()))
    try:
        for c in conns:
            assert c.recv_bytes() == b"ready"

        def once() -> None:
            for c in conns:
                c.send_bytes(b"go")
            for c in conns:
                c.recv()

        for _ in range(20):
            once()
        return _median_ms(once, iterations)
    finally:
        for c in conns:
            c.send_bytes(b"exit")
            c.close()
        for p in procs:
            p.wait()


def main(argv: list[str] | None = None) -> int:
    """Measure the three costs and print the table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500, help="calls timed per persistent/floor case")
    parser.add_argument("--fresh", type=int, default=3, help="fresh worlds started")
    args = parser.parse_args(argv)
    floor_ms = floor(args.iterations)
    persistent_ms = persistent(args.iterations)
    fresh_ms = fresh(args.fresh)
    exec_ms = fresh(args.fresh, "exec")
    print(f"tiny all-gather (4 floats), {SIZE}-rank gloo world, {os.cpu_count()} CPUs")
    print(f"{'case':<44}{'ms/call':>10}")
    print(f"{'persistent World.run (median)':<44}{persistent_ms:>10.2f}")
    print(f"{'fresh world per call, forked ranks (median)':<44}{fresh_ms:>10.1f}")
    print(f"{'fresh world per call, executed ranks (median)':<44}{exec_ms:>10.1f}")
    print(f"{'floor: bare pipe-driven ranks':<44}{floor_ms:>10.2f}")
    print(f"executed / forked world start = {exec_ms / fresh_ms:.1f}x")
    print(f"persistent / floor = {persistent_ms / floor_ms:.2f}x (goal <= 1.5x)")
    print(f"executed fresh / persistent = {exec_ms / persistent_ms:.0f}x (goal >= 300x)")
    print(f"forked fresh / persistent = {fresh_ms / persistent_ms:.0f}x")
    print(f"persistent under 6 ms: {'yes' if persistent_ms < 6 else 'NO'}")
    return 0


if __name__ == "__main__":
    # Rank functions are pickled by reference, and __main__ is not importable
    # in a rank: run main from this file imported under its module name.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

    sys.exit(harness.main())
