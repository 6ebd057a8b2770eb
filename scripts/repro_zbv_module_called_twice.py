"""Reproduce, in plain torch, ZBVZeroBubble failing on a stage whose forward calls one module twice.

    python scripts/repro_zbv_module_called_twice.py

Imports nothing of nemo_dist. Two gloo ranks on this machine (CPU) build a four-stage V pipeline (rank r holds
stages r and 3 - r) of a pre-norm residual block that applies one RMS norm twice (``h = h + mix(norm(h));
h + up(norm(h))``, a block reusing its norm before attention and before the MLP), and step it once; for
comparison the same block runs under ``Schedule1F1B`` (two stages, one a rank). In torch 2.13 the zero-bubble
weight pass (``stage_backward_weight``) raises "Trying to backward through the graph a second time" on the block
with the shared norm, and runs when each use has a norm of its own. Each line it prints says what was seen; it
exits 0 when the failure reproduces, 1 otherwise.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 1.5, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _Block(nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.first = _Norm()
        self.second = self.first if shared else _Norm()
        self.mix = nn.Linear(4, 4, dtype=torch.float64)
        self.up = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.mix(self.first(h))
        return h + self.up(self.second(h))


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).sum()


def _run(shared: bool, zbv: bool) -> str:
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    blocks = [_Block(shared) for _ in range(4 if zbv else 2)]
    cpu = torch.device("cpu")
    if zbv:
        stages = [PipelineStage(blocks[i], i, 4, cpu) for i in (rank, 2 * size - 1 - rank)]
        schedule = ScheduleZBVZeroBubble(stages, 2, loss_fn=_loss)
    else:
        stages = [PipelineStage(blocks[rank], rank, 2, cpu)]
        schedule = Schedule1F1B(stages[0], 2, loss_fn=_loss)
    x = torch.randn(4, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    try:
        schedule.step(*((x,) if first else ()), target=torch.zeros_like(x) if last else None)
    except RuntimeError as exc:
        return f"raised: {str(exc).splitlines()[0][:80]}"
    return "ran"


def _rank(rank: int, port: int, found: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    seen = {f"{'ZBVZeroBubble' if zbv else '1F1B'}, {'one norm used twice' if shared else 'a norm per use'}":
            _run(shared, zbv) for zbv in (False, True) for shared in (False, True)}
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
    print(f"torch {torch.__version__}; rank 0's step of each pipeline")
    for what, value in seen.items():
        print(f"  {what}: {value}")
    reproduced = (seen["ZBVZeroBubble, one norm used twice"].startswith("raised")
                  and seen["ZBVZeroBubble, a norm per use"] == "ran" and seen["1F1B, one norm used twice"] == "ran")
    print("reproduced: ZBVZeroBubble's weight pass fails on a module called twice" if reproduced
          else "not reproduced on this torch")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
