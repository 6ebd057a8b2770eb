"""Gallery fork: ``all_gather_v(x, sizes, dim=0, group=None)``, told every rank's size. Correct.

Pattern (modulus' distributed ``all_gather_v``, as its graph and sharded-
tensor code call it): the caller passes ``sizes``, the list of every rank's
size on ``dim``, which it knows from its partition, so no size is exchanged;
forward pads each rank's tensor to the largest size, all-gathers and drops the
padding; backward gives each rank the sum over ranks of their gradient for its
slice (the gradient sums, then this rank's rows). Checked with
``--gather-kwarg sizes=@row_sizes``, filled per call with every rank's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_v"]


class _AllGatherV(torch.autograd.Function):
    """Concatenate every rank's ``x`` (``sizes[r]`` on ``dim``); backward sums and keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sizes: Sequence[int], dim: int, group: Any) -> torch.Tensor:
        if x.shape[dim] != sizes[dist.get_rank(group)]:
            raise ValueError(f"all_gather_v: x has {x.shape[dim]} on dim {dim}, sizes says {list(sizes)}")
        ctx.sizes, ctx.dim, ctx.group = list(sizes), dim, group
        largest = max(sizes)
        pad = list(x.shape)
        pad[dim] = largest - x.shape[dim]
        padded = torch.cat([x, x.new_zeros(pad)], dim=dim).contiguous()
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes, strict=True)], dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=ctx.group)
        rank = dist.get_rank(ctx.group)
        return summed.narrow(ctx.dim, sum(ctx.sizes[:rank]), ctx.sizes[rank]), None, None, None


def all_gather_v(x: torch.Tensor, sizes: Sequence[int], dim: int = 0, group: Any = None) -> torch.Tensor:
    """Every rank's ``x`` concatenated on ``dim``, where rank r's size there is ``sizes[r]``; differentiable."""
    if dist.get_world_size(group) == 1:
        return x
    return _AllGatherV.apply(x, sizes, dim, group)
