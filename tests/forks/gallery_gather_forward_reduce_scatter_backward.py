"""Gallery fork: ``GatherForwardReduceScatterBackward.apply(x, process_group, dim)``. Correct.

Pattern (ColossalAI's ``_GatherForwardReduceScatterBackward`` in its
sequence-parallel layers): an autograd Function whose ``forward(ctx, input_,
process_group, dim, ...)`` takes the process group as a REQUIRED positional
parameter before ``dim`` (``None`` is how callers pass the whole world), gathers
every rank's tensor and concatenates on ``dim``; backward reduce-scatters the
gradient on ``dim`` (each rank gets the sum of every rank's gradient for its
slice). Checked with ``--gather-kwarg dim=0`` alone: a check without a
subgroup passes the whole world's group in the ``process_group`` slot.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GatherForwardReduceScatterBackward"]


def _split_sum(grad: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's slice of the sum over ``group`` of every rank's ``grad`` (a reduce-scatter on ``dim``)."""
    size = dist.get_world_size(group)
    chunks = [c.contiguous() for c in grad.chunk(size, dim=dim)]
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=group)
    return mine


class GatherForwardReduceScatterBackward(torch.autograd.Function):
    """Concatenate every rank's ``input_`` on ``dim`` over ``process_group``; backward reduce-scatters."""

    @staticmethod
    def forward(
        ctx: Any, input_: torch.Tensor, process_group: Any, dim: int, fp8_communication: bool = False
    ) -> torch.Tensor:
        if fp8_communication:
            raise NotImplementedError("fp8 communication needs CUDA float8 kernels")
        ctx.process_group, ctx.dim = process_group, dim
        size = dist.get_world_size(process_group)
        if size == 1:
            return input_
        parts = [torch.empty_like(input_, memory_format=torch.contiguous_format) for _ in range(size)]
        dist.all_gather(parts, input_.contiguous(), group=process_group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if dist.get_world_size(ctx.process_group) == 1:
            return grad, None, None, None
        return _split_sum(grad, ctx.dim, ctx.process_group), None, None, None
