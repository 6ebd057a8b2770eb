"""The moe suite's own layer: a tiny top-k mixture of experts whose experts a ``--moe-fn`` shards.

:class:`TinyMoE` routes each token to ``top_k`` of ``num_experts`` experts
(softmax scores, the chosen ones renormalised), adds the experts' outputs
weighted by them, and returns ``(output, aux_loss)``: Switch Transformer's
load-balance loss over the tokens it was given,
``num_experts * sum_e f_e * P_e`` (``f_e`` the share of assignments to
expert e, ``P_e`` its mean score). The experts live in :class:`TinyExperts`,
called as ``experts(tokens, indices, weights)``, which is what expert
parallelism replaces: their weights ``w1`` ``[E, dim, hidden]`` and ``w2``
``[E, hidden, dim]`` are the ones to shard on dim 0. float64 throughout.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TinyExperts", "TinyMoE", "expert_outputs"]


def expert_outputs(tokens: torch.Tensor, experts: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``tokens`` through expert ``experts[i]`` (an index into ``w1``/``w2``'s dim 0): a SiLU MLP."""
    out = tokens.new_zeros(tokens.shape)
    for e in torch.unique(experts).tolist():
        rows = (experts == e).nonzero(as_tuple=True)[0]
        out = out.index_add(0, rows, torch.nn.functional.silu(tokens[rows] @ w1[e]) @ w2[e])
    return out


class TinyExperts(nn.Module):
    """``num_experts`` SiLU MLPs stored as two stacked weights; ``forward(tokens, indices, weights)``."""

    def __init__(self, num_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(num_experts, dim, hidden, dtype=torch.float64) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(num_experts, hidden, dim, dtype=torch.float64) / hidden**0.5)

    def forward(self, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token's ``top_k`` experts' outputs (``indices`` ``[T, k]``) summed with ``weights`` ``[T, k]``."""
        k = indices.shape[1]
        pairs = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(k)
        out = expert_outputs(tokens[pairs], indices.reshape(-1), self.w1, self.w2)
        return tokens.new_zeros(tokens.shape).index_add(0, pairs, out * weights.reshape(-1, 1))


class TinyMoE(nn.Module):
    """A top-k mixture of experts: a replicated router (``router``, a biased Linear) and :class:`TinyExperts`."""

    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 12, top_k: int = 2) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(dim, num_experts, dtype=torch.float64)
        self.experts = TinyExperts(num_experts, dim, hidden)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scores, indices, weights)`` of ``tokens``: every expert's softmax score ``[T, E]``, the ``top_k``
        chosen ``[T, k]`` and their scores renormalised ``[T, k]``."""
        scores = torch.softmax(self.router(tokens), dim=-1)
        top, indices = torch.topk(scores, self.top_k, dim=-1)
        return scores, indices, top / top.sum(dim=-1, keepdim=True)

    def load_balance_loss(self, scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Switch's load-balance loss of a :meth:`route`'s ``scores`` and ``indices`` (0 for no tokens)."""
        if scores.shape[0] == 0:
            return scores.sum() * 0
        share = torch.bincount(indices.reshape(-1), minlength=self.num_experts).to(scores.dtype) / indices.numel()
        return self.num_experts * (share * scores.mean(dim=0)).sum()

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output, aux_loss)`` for ``tokens`` ``[T, dim]``; T may be 0 (the loss is then 0)."""
        scores, indices, weights = self.route(tokens)
        return self.experts(tokens, indices, weights), self.load_balance_loss(scores, indices)
