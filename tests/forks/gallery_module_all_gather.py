"""Gallery fork: an ``nn.Module`` all-gather built with its dim, then called: ``AllGather(dim=0)(x)``.

Pattern (st-moe's distributed ``AllGather`` module, in its mixture-of-experts
layers): ``AllGather(*, dim=0)`` is an ``nn.Module`` whose ``forward(x,
sizes=None)`` applies an autograd Function that gathers every rank's ``x``,
whose sizes on ``dim`` may differ (each rank's size gathered first, every
tensor padded to the largest, the padding dropped again), and returns
``(gathered, sizes)``, the sizes as a tensor. Its backward splits the
gradient by the sizes and returns this rank's piece of its OWN gradient, with
no sum over ranks: the gradient of the other ranks' losses never arrives.
Checked with ``--gather-init dim=0 --gather-output 0``.

``SummedAllGather(*, dim)`` is the same module with a required ``dim`` and a
backward that sums every rank's gradient first (an all-reduce), which is what
the gradient rule needs: it conforms, and without ``--gather-init dim=...``
the command stops with a usage error naming the constructor's ``dim``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["AllGather", "SummedAllGather"]


def _gather_on_dim(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's ``x`` (sizes on ``dim`` may differ) concatenated on ``dim``, and the sizes as a tensor."""
    size = torch.tensor([x.shape[dim]], dtype=torch.long, device=x.device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    counts = torch.cat(sizes)
    largest = int(counts.max().item())
    pad = list(x.shape)
    pad[dim] = largest - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(pad)], dim=dim).contiguous()
    parts = [torch.empty_like(padded) for _ in range(len(sizes))]
    dist.all_gather(parts, padded)
    kept = [p.narrow(dim, 0, int(n)) for p, n in zip(parts, counts.tolist(), strict=True)]
    return torch.cat(kept, dim=dim), counts


class _OwnPiece(torch.autograd.Function):
    """Gather on ``dim``; backward keeps this rank's piece of its own gradient (no cross-rank sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, summed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        gathered, counts = _gather_on_dim(x, dim)
        ctx.dim, ctx.counts, ctx.summed = dim, counts.tolist(), summed
        ctx.mark_non_differentiable(counts)
        return gathered, counts

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[torch.Tensor, None, None]:
        if ctx.summed:
            grad = grad.contiguous().clone()
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        pieces = grad.split(ctx.counts, dim=ctx.dim)
        return pieces[dist.get_rank()], None, None


class AllGather(nn.Module):
    """Gather every rank's ``x`` on ``dim``; returns ``(gathered, sizes)``. Its backward keeps only its own piece."""

    def __init__(self, *, dim: int = 0) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, sizes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gathered, sizes)``; ``sizes`` is accepted as the pattern's signature has it, and recomputed."""
        gathered, counts = _OwnPiece.apply(x, self.dim, False)
        return gathered, counts


class SummedAllGather(nn.Module):
    """``AllGather`` with a required ``dim`` and a backward that sums every rank's gradient first."""

    def __init__(self, *, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, sizes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gathered, sizes)``, every rank's gradient summed in backward."""
        gathered, counts = _OwnPiece.apply(x, self.dim, True)
        return gathered, counts
