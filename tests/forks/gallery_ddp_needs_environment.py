"""Gallery wrappers that need what a CPU world of the tool lacks: CUDA, or a launcher's environment variable.

Patterns common in trainers: ``cuda_ddp`` asserts CUDA and places the model
on the local GPU before wrapping (as scripts written for one GPU per rank
do); ``slurm_ddp`` reads SLURM's ``SLURM_LOCALID`` for its device. Each gets
one clear line from the tool (run with the nccl backend; run inside the
launcher), not a crash per check.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["cuda_ddp", "slurm_ddp"]


def cuda_ddp(model: nn.Module) -> DistributedDataParallel:
    """A DDP of ``model`` on the local GPU; asserts CUDA."""
    assert torch.cuda.is_available(), "this trainer runs on CUDA"
    device = torch.cuda.current_device()
    return DistributedDataParallel(model.cuda(device), device_ids=[device])


def slurm_ddp(model: nn.Module) -> DistributedDataParallel:
    """A DDP of ``model``, its device chosen from SLURM's local rank."""
    local = int(os.environ["SLURM_LOCALID"])
    device_ids = [local] if torch.cuda.is_available() else None
    return DistributedDataParallel(model, device_ids=device_ids)
