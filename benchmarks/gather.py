"""Forward + backward of ``all_gather_with_grad`` against two baselines, side by side.

Run: ``python benchmarks/gather.py [--backend gloo|nccl] [--elements 1048576] [--world-size 2]
[--iters 30] [--json PATH]``

In one world (default 2 gloo ranks on CPU, 1M float32 elements per rank; with
``--backend nccl`` rank r runs on ``cuda:r``) each rank times, interleaved round
by round so that machine noise hits all three alike:

* ``nemo_dist``: ``all_gather_with_grad(x)`` then ``backward(g)``;
* ``upstream``: the upstream-style autograd function: list ``all_gather`` + ``cat``
  forward, ``stack`` + ``all_reduce`` + index backward;
* ``bare``: the collective pair with no autograd: ``all_gather_single`` into one
  buffer, ``reduce_scatter_single`` of the gradient.

On CUDA each timed call is bracketed by ``torch.cuda.synchronize()``, so the
time includes the kernels, not only their launch. A contender's time in a round
is the slowest rank's; the figure reported is its median over ``--iters`` rounds
after ``--warmup`` rounds.

Bytes moved per rank per round are computed analytically, not measured, from
the collectives each contender issues, with n elements per rank, W ranks and
s bytes per element, counting the bytes each rank receives under the
bandwidth-optimal (ring) algorithms:

* all-gather of n elements per rank: ``(W-1) * n * s``;
* reduce-scatter of W*n elements: ``(W-1) * n * s``;
* all-reduce of W*n elements (ring: a reduce-scatter then an all-gather):
  ``2 * (W-1)/W * W*n * s = 2 * (W-1) * n * s``.

So ``nemo_dist`` and ``bare`` move ``2 (W-1) n s`` and ``upstream`` moves
``3 (W-1) n s`` per round: its backward all-reduce moves twice what a
reduce-scatter does (and W times what the reduce-scatter hands each rank).

Rank 0 prints the median milliseconds and bytes of each, and the ratios
``nemo_dist / upstream`` (time and bytes) and ``nemo_dist / bare``; ``--json PATH``
also writes these figures as JSON. The figures are ratios measured in the same
run, not absolute targets.

Exit status: 0 after printing; 2 on a usage error, including ``--backend nccl``
where CUDA is missing or fewer GPUs than ``--world-size`` are visible
("needs N GPUs, M visible").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
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
    out = torch.empty((g.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x)
    grad = torch.empty_like(x)
    dist.reduce_scatter_single(grad, g)


_CONTENDERS: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "nemo_dist": _nemo_dist,
    "upstream": _upstream,
    "bare": _bare,
}

# The collectives each contender issues per round: (collective, the elements it
# covers, with n the per-rank input size). round_bytes() prices them.
_COLLECTIVES: dict[str, tuple[tuple[str, str], ...]] = {
    "nemo_dist": (("all_gather", "n"), ("reduce_scatter", "W*n")),
    "upstream": (("all_gather", "n"), ("all_reduce", "W*n")),
    "bare": (("all_gather", "n"), ("reduce_scatter", "W*n")),
}


def bytes_per_rank(collective: str, size: int, elements: int, itemsize: int) -> int:
    """Bytes one rank receives in ``collective`` under the ring model (module docstring).

    ``elements`` is n, the per-rank input size: an all-gather gathers n from each
    rank, a reduce-scatter and an all-reduce reduce W*n.
    """
    if collective in ("all_gather", "reduce_scatter"):
        return (size - 1) * elements * itemsize
    if collective == "all_reduce":
        # 2 * (W-1)/W * W*n * s, kept in integers.
        return 2 * (size - 1) * elements * itemsize
    raise ValueError(f"no byte model for collective {collective!r}")


def round_bytes(name: str, size: int, elements: int, itemsize: int) -> int:
    """Bytes per rank per round (forward + backward) of contender ``name``."""
    return sum(bytes_per_rank(op, size, elements, itemsize) for op, _ in _COLLECTIVES[name])


def _rank_main(
    rank: int, backend: str, size: int, port: int, elements: int, iters: int, warmup: int, json_path: str | None
) -> None:
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
    # device_id binds the NCCL communicator to this rank's GPU (barrier included).
    extra: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, **extra)
    x = torch.randn(elements // 1024, 1024, device=device)
    g = torch.randn(size * x.shape[0], 1024, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times: dict[str, list[float]] = {name: [] for name in _CONTENDERS}
    for round_ in range(warmup + iters):
        for name, contender in _CONTENDERS.items():
            dist.barrier()
            sync()
            start = time.perf_counter()
            contender(x, g)
            sync()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[name].append(elapsed)
    # The slowest rank decides a collective's time.
    medians = torch.tensor([statistics.median(times[name]) for name in _CONTENDERS], dtype=torch.float64, device=device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if rank == 0:
        _report(backend, size, elements, x.element_size(), iters, warmup, (1e3 * medians).tolist(), device, json_path)
    dist.destroy_process_group()


def _report(
    backend: str,
    size: int,
    elements: int,
    itemsize: int,
    iters: int,
    warmup: int,
    medians_ms: list[float],
    device: torch.device,
    json_path: str | None,
) -> None:
    ms = dict(zip(_CONTENDERS, medians_ms, strict=True))
    nbytes = {name: round_bytes(name, size, elements, itemsize) for name in _CONTENDERS}
    where = f"{size} {backend} ranks" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    print(f"all_gather_with_grad forward+backward, {where}, {elements:,} float32 per rank, median of {iters} rounds")
    for name, value in ms.items():
        print(f"  {name:<10} {value:8.2f} ms  {nbytes[name] / 1e6:9.2f} MB/rank/round")

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    time_vs_upstream = ratio(ms["nemo_dist"], ms["upstream"])
    bytes_vs_upstream = ratio(nbytes["nemo_dist"], nbytes["upstream"])
    time_vs_bare = ratio(ms["nemo_dist"], ms["bare"])
    print(f"  nemo_dist / upstream = {fmt(time_vs_upstream)} time, {fmt(bytes_vs_upstream)} bytes")
    print(f"  nemo_dist / bare     = {fmt(time_vs_bare)} time")
    if json_path is None:
        return
    figures = {
        "backend": backend,
        "world_size": size,
        "elements_per_rank": elements,
        "dtype": "float32",
        "itemsize": itemsize,
        "iters": iters,
        "warmup": warmup,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "byte_model": "bytes received per rank, ring algorithms: all_gather(n) and reduce_scatter(W*n) "
        "(W-1)*n*s, all_reduce(W*n) 2*(W-1)/W*W*n*s",
        "contenders": {
            name: {
                "median_ms": ms[name],
                "bytes_per_rank_per_round": nbytes[name],
                "collectives": [{"op": op, "elements": count} for op, count in _COLLECTIVES[name]],
            }
            for name in _CONTENDERS
        },
        "ratios": {
            "nemo_dist/upstream_time": time_vs_upstream,
            "nemo_dist/upstream_bytes": bytes_vs_upstream,
            "nemo_dist/bare_time": time_vs_bare,
        },
    }
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(figures, fh, indent=2)
        fh.write("\n")
    print(f"  figures written to {json_path}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpu_shortage(size: int) -> str | None:
    """Why ``size`` NCCL ranks cannot run here (one GPU per rank), or None when they can."""
    if not torch.cuda.is_available():
        return f"needs {size} GPUs, 0 visible (CUDA is not available in this torch {torch.__version__})"
    visible = torch.cuda.device_count()
    if visible < size:
        return f"needs {size} GPUs, {visible} visible"
    return None


def main() -> None:
    """Parse the arguments and run the benchmark world; rank 0 prints the table.

    Exits 2 (as argparse does on a usage error) when ``--backend nccl`` cannot
    put one rank per visible GPU.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="gloo on CPU (default) or nccl with rank r on cuda:r",
    )
    parser.add_argument("--elements", type=int, default=1 << 20, help="float32 elements per rank (multiple of 1024)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures as JSON to PATH")
    args = parser.parse_args()
    if args.elements < 1024 or args.elements % 1024:
        parser.error("--elements must be a positive multiple of 1024")
    if args.world_size < 1:
        parser.error("--world-size must be at least 1")
    if args.backend == "nccl":
        shortage = _gpu_shortage(args.world_size)
        if shortage is not None:
            print(f"{parser.prog}: --backend nccl {shortage}", file=sys.stderr)
            sys.exit(2)
    mp.spawn(
        _rank_main,
        args=(args.backend, args.world_size, _free_port(), args.elements, args.iters, args.warmup, args.json),
        nprocs=args.world_size,
    )


if __name__ == "__main__":
    main()
