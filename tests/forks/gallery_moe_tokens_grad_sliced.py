"""Tokens brought to the experts by a gather whose backward keeps this rank's slice of the gradient, as
``full_tensor()``'s backward does (Replicate to Shard: a slice), where every rank's gradient of those rows must be
summed first (a reduce-scatter): the class of NeMo AutoModel PR 1260. Outputs, router and expert gradients are
right; the gradient that reaches the layers before the MoE holds only this rank's experts' part.

Broken: moe.gradients_equal_one_process fails on the tokens' gradient alone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.forks.gallery_moe_allgather_allreduce import gathered_experts


class _GatherSliceBackward(torch.autograd.Function):
    """Forward: every rank's rows (padded all-gather). Backward: this rank's rows of its own gradient, unsummed."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, sizes: list[int], group: Any) -> torch.Tensor:
        ctx.start, ctx.count = sum(sizes[: dist.get_rank(group)]), rows.shape[0]
        padded = torch.cat([rows, rows.new_zeros((max(sizes) - rows.shape[0], *rows.shape[1:]))])
        every = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(every, padded.contiguous(), group=group)
        return torch.cat([g[:n] for g, n in zip(every, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.narrow(0, ctx.start, ctx.count).contiguous(), None, None


def _gather(rows: torch.Tensor, sizes: list[int], group: Any) -> list[torch.Tensor]:
    return [_GatherSliceBackward.apply(rows, sizes, group)]


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """The all-gather / all-reduce expert parallelism, its token gather's backward a slice."""
    return gathered_experts(layer, ep_mesh, _gather)
