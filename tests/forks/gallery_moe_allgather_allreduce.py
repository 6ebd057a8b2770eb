"""NeMo AutoModel's default ``GroupedExperts`` path, re-expressed: every rank's tokens all-gathered (padded to the
longest rank's, with autograd), each rank running its own experts on every token, and the partial outputs summed
with an autograd all-reduce before each rank keeps its own tokens' rows.

Correct. ``--moe-fn tests.forks.gallery_moe_allgather_allreduce:apply_ep``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn

from tests.forks._experts import local_mlp, shard_experts


def padded_gather(t: torch.Tensor, sizes: list[int], group: Any) -> list[torch.Tensor]:
    """Every rank's rows of ``t`` (``sizes[r]`` each), padded to the longest for torch's autograd all-gather."""
    padded = torch.cat([t, t.new_zeros((max(sizes) - t.shape[0], *t.shape[1:]))])
    return [g[:n] for g, n in zip(dist_nn.all_gather(padded, group=group), sizes, strict=True)]


def gathered_experts(
    layer: nn.Module, ep_mesh: Any, gather_tokens: Callable[[torch.Tensor, list[int], Any], list[torch.Tensor]]
) -> nn.Module:
    """Shard the experts; every rank computes its experts' share for all tokens (brought by ``gather_tokens``),
    summed over ranks."""
    per_rank = shard_experts(layer, ep_mesh)
    group = ep_mesh.get_group()

    def forward(self: nn.Module, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        me, size = dist.get_rank(group), dist.get_world_size(group)
        count = torch.tensor([tokens.shape[0]])
        counts = [torch.empty_like(count) for _ in range(size)]
        dist.all_gather(counts, count, group=group)
        sizes = [int(c) for c in counts]
        all_tokens = torch.cat(gather_tokens(tokens, sizes, group))
        all_indices = torch.cat(padded_gather(indices.to(tokens.dtype), sizes, group)).long()
        all_weights = torch.cat(padded_gather(weights, sizes, group))
        k = all_indices.shape[1]
        pairs = torch.arange(all_tokens.shape[0]).repeat_interleave(k)
        flat = all_indices.reshape(-1)
        mine = (flat >= me * per_rank) & (flat < (me + 1) * per_rank)
        local = torch.where(mine, flat - me * per_rank, torch.full_like(flat, -1))
        out = local_mlp(all_tokens[pairs], local, self.w1.to_local(), self.w2.to_local())
        partial = all_tokens.new_zeros(all_tokens.shape).index_add(0, pairs, out * all_weights.reshape(-1, 1))
        total = dist_nn.all_reduce(partial, group=group)
        start = sum(sizes[:me])
        return total[start:start + tokens.shape[0]]

    layer.experts.forward = types.MethodType(forward, layer.experts)
    return layer


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard the experts; every rank computes its experts' share for all tokens, summed over ranks."""
    return gathered_experts(layer, ep_mesh, padded_gather)
