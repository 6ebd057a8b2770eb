"""The small seeded models the FSDP2 checks shard: a language model's shape, token ids in.

:class:`TinyLM` is what NeMo AutoModel's FSDP2 path expects of a model:
an input embedding, a ``layers`` ``ModuleList`` of transformer-like blocks
(each with counted ``attn`` and ``mlp`` sub-modules, as the ddp suite's, so
checkpointing shows as calls during backward), a final scale (the root unit's
own parameter) and an output head, with
Hugging Face's ``get_input_embeddings``/``get_output_embeddings``. Its
input is token ids: upstream's default mixed-precision policy casts no
forward inputs, and integer ids need none. ``VOCAB`` rows split unevenly
over 3 and 4 shards (``torch.chunk``: 4, 4, 2 and 3, 3, 3, 1), so uneven
shards are exercised at those world sizes. The tied variant shares the
head's weight with the embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_dist.conformance.suites.ddp.models import DIM, _Block
from nemo_dist.conformance.suites.ddp.templates import manual_seed

__all__ = ["LAYERS", "VOCAB", "SideInputLM", "TinyLM", "blocks", "tiny_lm"]

#: Rows of the embedding and the head: uneven over 3 and 4 shards.
VOCAB = 10
#: Blocks in ``layers``.
LAYERS = 3


class TinyLM(nn.Module):
    """``embed`` -> ``layers`` (blocks) -> ``scale`` -> ``head``: logits per token. ``tied``: the head's weight is
    the embedding's."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(_Block(DIM) for _ in range(LAYERS))
        # The root unit's own parameter, where real models keep a final norm's weight (a product: no dtype clash
        # when a layer's output_dtype differs from the root's compute dtype).
        self.scale = nn.Parameter(torch.ones(DIM))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        """The input embedding (Hugging Face's getter, which upstream's sharding reads)."""
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        """The output head (Hugging Face's getter)."""
        return self.head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, VOCAB]`` of 1-D token ids (one token per row: no 3-D views for FSDP2 to warn about)."""
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x * self.scale)


def tiny_lm(seed: int, dtype: torch.dtype, tied: bool = False) -> TinyLM:
    """A :class:`TinyLM` with weights drawn from ``seed`` (the same on every rank: ``fully_shard`` broadcasts none)."""
    manual_seed(seed)
    return TinyLM(tied).to(dtype)


def blocks(model: TinyLM) -> dict[str, _Block]:
    """Block name (``layers.0``) -> block, taken before sharding (wrapping may replace the list's entries)."""
    return {f"layers.{index}": block for index, block in enumerate(model.layers)}  # type: ignore[misc]


class _SideBlock(nn.Module):
    """A block that also takes a float side input (a mask or position table, as real layers do); records dtypes.

    ``seen`` holds, per forward, the dtypes its ``forward`` received for the residual stream and the side input:
    what FSDP's pre-forward cast (``cast_forward_inputs``) left of them.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = _Block(dim)
        self.gate = nn.Parameter(torch.full((dim,), 0.5))
        self.seen: list[tuple[str, str]] = []

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        self.seen.append((str(x.dtype).removeprefix("torch."), str(side.dtype).removeprefix("torch.")))
        out = self.block(x)
        return out + (self.gate * side).to(out.dtype)  # the residual stream keeps the dtype the block computed in


class SideInputLM(TinyLM):
    """:class:`TinyLM` whose layers each take a float32 side input beside the residual stream."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_SideBlock(DIM) for _ in range(LAYERS))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of 1-D token ids; each layer also gets a float32 side input of the rows' positions."""
        x = self.embed(tokens)
        side = torch.arange(tokens.shape[0], dtype=torch.float32, device=tokens.device)[:, None].expand(-1, DIM)
        for layer in self.layers:
            x = layer(x, side / 8)
        return self.head(x * self.scale)
