"""The pp suite's tiny language model, written to be split into pipeline stages (torchtitan's style).

Its parts run in order: ``tok_embeddings``, the blocks of ``layers`` (an
``nn.ModuleDict`` keyed by layer index, so a stage's copy keeps every
parameter's name), ``norm`` and ``output``. Any part may be ``None`` (a stage
without it): the embedding-less stage takes hidden states, the head-less one
returns them. Every norm's weight starts away from 1 (a norm applied twice,
or skipped, changes the numbers), and each block mixes the sequence causally
(a running sum over each position's count), so microbatches split on the sequence dim change them too.
Every block takes the keyword input ``position_ids`` (``[batch, seq]``, as
packed sequences give it): the count a position's running sum is divided by
is its position plus one, so a block given other positions (a stage that
never receives them runs with the default ``0..seq-1``) computes something
else. Without the keyword the numbers are exactly those of the running mean.
Nine layers by default: 2, 4, 6 or 8 stages split them unevenly.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LAYERS", "VOCAB", "Block", "RMSNorm", "TinyPipelineLM"]

#: The default layer count: 2, 4, 6 and 8 stages (pp 2 and 4, one or two stages a rank) split it unevenly.
LAYERS = 9
#: The vocabulary: labels and token ids are drawn below it.
VOCAB = 16


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned weight, drawn around 1 (never exactly 1)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.5 * torch.rand(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` over its root mean square on the last dim, times the weight."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """A pre-norm residual block: a causal running mean over the sequence, then a small MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.mlp_norm = RMSNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, h: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``h`` plus the block's update (``[batch, seq, dim]`` in and out): the running sum at each position divided
        by ``position_ids + 1`` (``[batch, seq]``; default ``0..seq-1``: the running mean)."""
        x = self.norm(h)
        if position_ids is None:
            steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device).view(1, -1, 1)
        else:
            steps = (position_ids + 1).to(x.dtype).unsqueeze(-1)
        h = h + self.mix(x.cumsum(dim=1) / steps)
        return h + self.down(torch.tanh(self.up(self.mlp_norm(h))))


class TinyPipelineLM(nn.Module):
    """Embedding, ``layers`` blocks, a final norm and an untied head (``tie=True``: the head is the embedding)."""

    def __init__(self, layers: int = LAYERS, vocab: int = VOCAB, dim: int = 8, hidden: int = 16,
                 tie: bool = False) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, hidden) for i in range(layers)})
        self.norm: nn.Module | None = RMSNorm(dim)
        self.output: nn.Linear | None = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (or, without an embedding, hidden states) to logits (or, without a head, hidden states);
        ``position_ids`` reach every block (None: each block's default)."""
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h, position_ids=position_ids)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
