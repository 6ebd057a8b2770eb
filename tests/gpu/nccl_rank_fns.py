"""Rank-side functions of the NCCL tests (an importable module: a World pickles functions by reference)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.distributed import DDPConfig, DDPManager


def manager_after_another_device_was_current() -> dict[str, Any]:
    """Make another GPU current, build a ``DDPManager``; report the current device and ``manager.device``.

    The rank's own GPU is made current again afterwards whatever happens.
    """
    count = torch.cuda.device_count()
    original = torch.cuda.current_device()
    torch.cuda.set_device((dist.get_rank() + 1) % count)
    try:
        manager = DDPManager(DDPConfig())
        current = torch.cuda.current_device()
    finally:
        torch.cuda.set_device(original)
    return {"count": count, "current": current, "device": str(manager.device)}


def wrapped_linear_step() -> dict[str, Any]:
    """Wrap a CPU-built linear layer with ``DDPManager`` and train one step on the manager's device.

    Returns DDP's ``device_ids``, the parameter, output and gradient devices,
    and the gradient (on CPU) of a loss whose local rows are the rank number.
    """
    manager = DDPManager(DDPConfig())
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False).double()
    wrapped = manager.parallelize(model)
    x = torch.full((2, 4), float(dist.get_rank()), dtype=torch.float64, device=manager.device)
    out = wrapped(x)
    out.sum().backward()
    grad = model.weight.grad
    assert grad is not None
    return {
        "device_ids": wrapped.device_ids,
        "param_device": str(model.weight.device),
        "out_device": str(out.device),
        "grad_device": str(grad.device),
        "grad": grad.detach().cpu(),
    }
