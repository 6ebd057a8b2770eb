"""Gallery fork: ``AllGatherFunc.apply(x, *buffers)``, gathering into W buffers the caller allocates.

Pattern (insightface's partial-FC ``AllGatherFunc``): an autograd Function
whose ``forward(ctx, tensor, *gather_list)`` all-gathers into the W tensors
the caller passed (each shaped like ``x``) and returns them as a tuple.
Backward reduces each rank's slot of the gradients to that rank (a SUM, so
rank r holds every rank's gradient for its rows, as the rule wants), then
multiplies it by the world size "to cooperate with a distributed loss": the
gradient is W times the rule's. Checked with ``--gather-kwarg
gather_list=@out_buffers``: the W empty buffers like ``x`` are filled per
call. (Unlike the pattern, which gathers ``x`` as given, it makes ``x``
contiguous first, so the checks of strided inputs judge the gradient alone.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllGatherFunc"]


class AllGatherFunc(torch.autograd.Function):
    """Gather into the given buffers; backward sums each slot on its rank, then scales by W."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, *gather_list: torch.Tensor) -> tuple[torch.Tensor, ...]:
        buffers = list(gather_list)
        dist.all_gather(buffers, tensor.contiguous())
        return tuple(buffers)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        slots = [g.contiguous().clone() for g in grads]
        rank = dist.get_rank()
        works = [dist.reduce(slot, owner, op=dist.ReduceOp.SUM, async_op=True) for owner, slot in enumerate(slots)]
        for work in works:
            work.wait()
        mine = slots[rank] * len(slots)  # BUG: "cooperates" with a loss that divides by W: W times the rule
        return (mine, *[None] * len(slots))
