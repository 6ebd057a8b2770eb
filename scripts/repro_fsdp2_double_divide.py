"""Reproduce, in plain torch, FSDP2 dividing float64 gradients by ``set_gradient_divide_factor``'s factor twice.

    python scripts/repro_fsdp2_double_divide.py

Imports nothing of nemo_dist. Two gloo ranks on this machine (CPU) shard a ``Linear(2, 2)`` with torch's own
``fully_shard`` over an HSDP mesh of 2 replicas x 1 shard (each shard group one rank) and state the mean's factor,
``set_gradient_divide_factor(2)``. Rank r feeds ``[r + 1, r + 1]``; the right gradient of ``sum(out)`` is every
rank's summed and divided by 2: 1.5 in every entry. In torch 2.13 float32 gives 1.5 and float64 gives 0.75 (the
factor applied twice: ``_fsdp_collectives.py`` divides dtypes at overflow risk before and after the reduction, and
its ``world_size == 1`` branch divides the copy once more). Over a 1-D mesh of both ranks (shard groups of two)
both dtypes give 1.5. Each line it prints says what was seen; it exits 0 when the double divide reproduces, 1
otherwise.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def _grad(mesh: object, dtype: torch.dtype) -> float:
    model = nn.Linear(2, 2, bias=False, dtype=dtype)
    with torch.no_grad():
        model.weight.fill_(1.0)
    fully_shard(model, mesh=mesh)
    model.set_gradient_divide_factor(2.0)
    model(torch.full((1, 2), float(dist.get_rank() + 1), dtype=dtype)).sum().backward()
    return float(model.weight.grad.full_tensor().double().mean())  # type: ignore[union-attr]


def _rank(rank: int, port: int, found: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    hsdp = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp_replicate", "dp_shard"))
    flat = init_device_mesh("cpu", (2,))
    seen = {f"{name} {str(dtype).removeprefix('torch.')}": _grad(mesh, dtype)
            for name, mesh in (("HSDP 2x1", hsdp), ("FSDP over 2", flat)) for dtype in (torch.float64, torch.float32)}
    if rank == 0:
        found.update(seen)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        found = manager.dict()
        mp.spawn(_rank, args=(port, found), nprocs=2)
        seen = dict(found)
    print(f"torch {torch.__version__}; the right gradient is 1.5 in every entry")
    for what, value in seen.items():
        print(f"  {what}: {value:g}")
    doubled = seen["HSDP 2x1 float64"] == 0.75 and seen["HSDP 2x1 float32"] == 1.5
    print("reproduced: float64 divided by the factor twice in one-rank shard groups" if doubled
          else "not reproduced on this torch")
    return 0 if doubled else 1


if __name__ == "__main__":
    sys.exit(main())
