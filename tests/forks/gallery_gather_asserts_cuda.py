"""Gallery fork: a gather that asserts its input is on CUDA. Correct on GPUs; cannot run on CPU.

Pattern (xtuner's sequence-parallel communication helpers, written for NCCL
only): the function begins with ``assert x.is_cuda`` and then gathers as any
correct gather does (an autograd Function whose backward sums every rank's
gradient and keeps this rank's rows). On a CPU (gloo) run the assertion fails
on every rank; the command says, in one line, to run it with ``--backend nccl``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_on_cuda"]


class _Gather(torch.autograd.Function):
    """Concatenate every rank's ``x``; backward sums every rank's gradient and keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group, ctx.rows = group, x.shape[0]
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=ctx.group)
        start = dist.get_rank(ctx.group) * ctx.rows
        return summed[start : start + ctx.rows], None


def gather_on_cuda(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's ``x`` concatenated on dim 0; ``x`` must live on a CUDA device."""
    assert x.is_cuda
    return _Gather.apply(x, group)
