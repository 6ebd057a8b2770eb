"""Reproduce, in plain torch, ``scale_grads=True`` rescaling gradients accumulated over schedule steps.

    python scripts/repro_scale_grads_accumulation.py

Imports nothing of nemo_dist. Two gloo ranks on this machine (CPU) split a float64 model of two linear layers into
two stages, one a rank, under ``Schedule1F1B`` with 2 microbatches and a mean loss, torch's default
``scale_grads=True``. The gradients are cleared once; then ``schedule.step`` runs on batch A and on batch B without
clearing between them, as a loop accumulating two steps does. One process computes each batch's mean-loss gradient
alone (A's, B's). In torch 2.13 the schedule divides the whole ``.grad`` by the microbatch count at the end of every
step (``PipelineStage.scale_grads``), so the accumulated gradient is A's / 2 + B's instead of A's + B's; with
``scale_grads=False`` and the loss divided by the microbatch count it is A's + B's. Each line it prints says what
was seen; it exits 0 when the rescaling reproduces, 1 otherwise.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

MICROBATCHES = 2


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3)).double()


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 4, generator=generator, dtype=torch.float64),
             torch.randint(0, 3, (4,), generator=generator)) for _ in range(2)]


def _accumulated(scale_grads: bool) -> torch.Tensor:
    """This rank's first parameter's gradient after two accumulated steps (rank 1 holds the last layer)."""
    rank = dist.get_rank()
    stage_module = _model()[rank]
    stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target) / (1 if scale_grads else MICROBATCHES)

    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=loss, scale_grads=scale_grads)
    for inputs, labels in _batches():
        schedule.step(*((inputs,) if rank == 0 else ()), target=labels if rank == 1 else None)
    return next(stage_module.parameters()).grad.detach().clone()


def _alone(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One process: each batch's mean-loss gradient of rank ``rank``'s first parameter."""
    parts = []
    for inputs, labels in _batches():
        model = _model()
        F.cross_entropy(model(inputs), labels).backward()
        parts.append(next(model[rank].parameters()).grad.detach().clone())
    return parts[0], parts[1]


def _rank(rank: int, port: int, found: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        part_a, part_b = _alone(rank)
        default, scaled_loss = _accumulated(True), _accumulated(False)
        found[rank] = (  # type: ignore[index]
            (default - (part_a / MICROBATCHES + part_b)).abs().max().item(),
            (default - (part_a + part_b)).abs().max().item(),
            (scaled_loss - (part_a + part_b)).abs().max().item(),
        )
    finally:
        dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        found = manager.dict()
        mp.spawn(_rank, args=(port, found), nprocs=2)
        results = dict(found)
    print(f"torch {torch.__version__}")
    reproduced = True
    for rank, (rescaled, summed, fixed) in sorted(results.items()):
        print(f"rank {rank}: scale_grads=True, two steps accumulated: off by {summed:.3g} from A's + B's, "
              f"{rescaled:.3g} from A's / {MICROBATCHES} + B's; scale_grads=False with the loss over "
              f"{MICROBATCHES}: off by {fixed:.3g} from A's + B's")
        reproduced &= rescaled < 1e-12 < summed and fixed < 1e-12
    print("reproduced: the schedule divides the accumulated .grad again at every step" if reproduced
          else "not reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
