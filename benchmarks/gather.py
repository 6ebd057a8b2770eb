"""Forward + backward of ``all_gather_with_grad`` against two baselines, side by side.

Run: ``python benchmarks/gather.py [--elements 1048576] [--world-size 2] [--iters 30]``

In one gloo world (default 2 ranks, 1M float32 elements per rank) each rank
times, interleaved round by round so that machine noise hits all three alike:

* ``nemo_dist``: ``all_gather_with_grad(x)`` then ``backward(g)``;
* ``upstream``: the upstream-style autograd function: list ``all_gather`` + ``cat``
  forward, ``stack`` + ``all_reduce`` + index backward;
* ``bare``: the collective pair with no autograd: ``all_gather_single`` into one
  buffer, ``reduce_scatter_single`` of the gradient.

Rank 0 prints the median milliseconds of each and the ratios
``nemo_dist / upstream`` and ``nemo_dist / bare``.  The figures are ratios
measured in the same run, not absolute targets.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_dist.loss.dist_utils import all_gather_with_grad


class _UpstreamAllGather(torch.autograd.Function):
    """The upstream implementation's shape: W-tuple forward, all-reduce backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return tuple(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        stacked = torch.stack(grads)
        dist.all_reduce(stacked)
        return stacked[dist.get_rank()]


def _nemo_dist(x: torch.Tensor, g: torch.Tensor) -> None:
    leaf = x.detach().requires_grad_()
    all_gather_with_grad(leaf).backward(g)


def _upstream(x: torch.Tensor, g: torch.Tensor) -> None:
    leaf = x.detach().requires_grad_()
    torch.cat(_UpstreamAllGather.apply(leaf)).backward(g)


def _bare(x: torch.Tensor, g: torch.Tensor) -> None:
    out = torch.empty((g.shape[0], *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_single(out, x)
    grad = torch.empty_like(x)
    dist.reduce_scatter_single(grad, g)


_CONTENDERS = {"nemo_dist": _nemo_dist, "upstream": _upstream, "bare": _bare}


def _rank_main(rank: int, size: int, port: int, elements: int, iters: int, warmup: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    x = torch.randn(elements // 1024, 1024)
    g = torch.randn(size * x.shape[0], 1024)
    times: dict[str, list[float]] = {name: [] for name in _CONTENDERS}
    for round_ in range(warmup + iters):
        for name, contender in _CONTENDERS.items():
            dist.barrier()
            start = time.perf_counter()
            contender(x, g)
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[name].append(elapsed)
    # The slowest rank decides a collective's time.
    medians = torch.tensor([statistics.median(times[name]) for name in _CONTENDERS], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if rank == 0:
        ms = dict(zip(_CONTENDERS, (1e3 * medians).tolist(), strict=True))
        print(f"all_gather_with_grad forward+backward, {size} gloo ranks, {elements:,} float32 per rank, "
              f"median of {iters} rounds")
        for name, value in ms.items():
            print(f"  {name:<10} {value:8.2f} ms")
        print(f"  nemo_dist / upstream = {ms['nemo_dist'] / ms['upstream']:.2f}x")
        print(f"  nemo_dist / bare     = {ms['nemo_dist'] / ms['bare']:.2f}x")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Parse the arguments and run the benchmark world; rank 0 prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20, help="float32 elements per rank (multiple of 1024)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    mp.spawn(
        _rank_main,
        args=(args.world_size, _free_port(), args.elements, args.iters, args.warmup),
        nprocs=args.world_size,
    )


if __name__ == "__main__":
    main()
