"""Small gloo all-reduces with the rank's gloo I/O thread under the normal policy and under SCHED_BATCH, side by side.

Run ``python benchmarks/gloo_io_thread.py [--runs N] [--calls C] [--world-sizes SIZES]``
from a clone (Linux). For each world size (default 2,3,4) it starts a gloo
world on this machine ``--runs`` times per policy (default 3), alternately,
and each rank times ``--calls`` all-reduces of 16 float64 values (default
1000) after a warm-up. Both sides make their groups as a harness rank does
(``nemo_dist.testing._gloo_device.share_one_device``); on the "normal" side
the I/O thread keeps the policy it started with. It prints each run's
slowest rank (wall and CPU seconds of its process), then per world size the
medians and the ratio batch/normal.

What it shows is the cost of the I/O thread's spin (see the module
docstring of ``nemo_dist/testing/_gloo_device.py``): it appears where the
ranks' threads outnumber the cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_dist.testing import _gloo_device  # the clone's package, not an installed one

POLICIES = ("normal", "batch")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rank(rank: int, size: int, port: int, policy: str, calls: int, results: dict[int, tuple[float, float]]) -> None:
    import torch.distributed as dist

    if policy == "normal":
        _gloo_device.batch_scheduled = lambda make: make()  # the devices' threads keep the policy they start with
    _gloo_device.share_one_device()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    values = torch.zeros(16, dtype=torch.float64)
    for _ in range(50):
        dist.all_reduce(values)
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(values)
    results[rank] = (time.perf_counter() - wall, time.process_time() - cpu)
    dist.barrier()
    dist.destroy_process_group()


def run_world(size: int, policy: str, calls: int) -> tuple[float, float]:
    """The slowest rank's (wall, CPU) seconds for ``calls`` all-reduces in a world of ``size`` under ``policy``."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(size, _free_port(), policy, calls, results), nprocs=size)
        walls, cpus = zip(*results.values(), strict=True)
    return max(walls), max(cpus)


def main(argv: list[str] | None = None) -> int:
    """Measure both policies at each world size and print the ratios; 0, or 2 where policies are not Linux's."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="worlds per policy and world size (default 3)")
    p.add_argument("--calls", type=int, default=1000, help="timed all-reduces per world (default 1000)")
    p.add_argument("--world-sizes", default="2,3,4", help="world sizes (default 2,3,4)")
    args = p.parse_args(argv)
    if not hasattr(os, "SCHED_BATCH"):
        print("SCHED_BATCH is a Linux policy: nothing to compare here")
        return 2
    print(f"{os.cpu_count()} cores, torch {torch.__version__}, {args.calls} all-reduces of 16 float64 values per world")
    for size in (int(s) for s in args.world_sizes.split(",")):
        measured: dict[str, list[tuple[float, float]]] = {policy: [] for policy in POLICIES}
        for i in range(args.runs):
            for policy in POLICIES:
                wall, cpu = run_world(size, policy, args.calls)
                measured[policy].append((wall, cpu))
                print(f"world {size} run {i + 1} {policy:6}: slowest rank {wall:6.2f} s wall, {cpu:6.2f} s CPU")
        normal, batch = (statistics.median(w for w, _ in measured[policy]) for policy in POLICIES)
        print(f"world {size}: median normal {normal:.2f} s, batch {batch:.2f} s, "
              f"ratio batch/normal {batch / normal:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
