"""All-gather callables (``--gather-fn`` targets) whose backward reduces some dtypes in another precision.

Each is a ``torch.autograd.Function`` whose forward is an exact all-gather
(concatenated on dim 0) and whose backward casts the gradient of each dtype
named in its table to the paired dtype, all-reduces it, casts it back and
keeps this rank's rows. A narrower pair loses precision (broken); a wider one
(bfloat16 summed in float32) is correct and must conform.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "FLOAT32_IN_BFLOAT16",
    "FLOAT32_IN_FLOAT16",
    "FLOAT64_IN_BFLOAT16",
    "FLOAT64_IN_FLOAT32",
    "FORWARD_FLOAT64_VIA_FLOAT32",
    "WIDER",
]


def _gather(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def _reducing(via: dict[torch.dtype, torch.dtype], forward_via: dict[torch.dtype, torch.dtype] | None = None) -> Any:
    """A gather whose backward reduces dtype ``d`` in ``via[d]`` (forward through ``forward_via[d]``, if named)."""
    forward_via = forward_via or {}

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.rows = x.shape[0]
            if x.dtype in forward_via:
                return _gather(x.to(forward_via[x.dtype])).to(x.dtype)
            return _gather(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            reduced = grad.contiguous().to(via.get(grad.dtype, grad.dtype)).clone()
            dist.all_reduce(reduced)
            start = dist.get_rank() * ctx.rows
            return reduced[start : start + ctx.rows].to(grad.dtype)

    return Gather


FLOAT64_IN_FLOAT32 = _reducing({torch.float64: torch.float32})
FLOAT64_IN_BFLOAT16 = _reducing({torch.float64: torch.bfloat16})
FLOAT32_IN_FLOAT16 = _reducing({torch.float32: torch.float16})
FLOAT32_IN_BFLOAT16 = _reducing({torch.float32: torch.bfloat16})
#: Correct: every dtype summed in a wider one (float64 in float64), then rounded once.
WIDER = _reducing({torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64})
#: Broken forward: float64 inputs gathered as float32 (backward exact).
FORWARD_FLOAT64_VIA_FLOAT32 = _reducing({}, {torch.float64: torch.float32})
