"""The small seeded models the DDP checks train: transformer-like blocks that count their forward calls.

Built on CPU in float64 by the rank functions (:mod:`~nemo_dist.conformance.ddp.ranks`,
:mod:`~nemo_dist.conformance.ddp.training`);
the attention and _MLP of each block count how often their ``forward`` runs,
so checkpointing shows as extra calls during backward.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

# The model classes keep their leading underscore: their names appear in verdicts
# ("the entry point returned _TinyModel, not DistributedDataParallel").
__all__ = ["DIM", "bucket_model", "multimodal_blocks"]

#: Feature width of the models.
DIM = 8


class _Attention(nn.Module):
    """Row-wise attention-like mixing; counts its forward calls (recompute included)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.softmax(self.query(x), dim=-1) * self.value(x)


class _MLP(nn.Module):
    """Two-layer tanh _MLP; counts its forward calls."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.down(torch.tanh(self.up(x)))


class _Block(nn.Module):
    """A transformer-like block: residual attention, then residual _MLP (rows independent)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = _Attention(dim)
        self.mlp = _MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(x)
        return h + self.mlp(h)


class _TinyModel(nn.Module):
    """``model.layers`` (the language group) of two blocks and a linear head."""

    def __init__(self, dim: int = DIM, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return self.head(x)


class _Tower(nn.Module):
    """A stack of blocks kept under the attribute name ``attr``."""

    def __init__(self, attr: str, depth: int, dim: int) -> None:
        super().__init__()
        self.attr = attr
        setattr(self, attr, nn.ModuleList(_Block(dim) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in getattr(self, self.attr):
            x = block(x)
        return x


class _MultimodalModel(nn.Module):
    """``language_model.layers``, ``visual.blocks`` (block 1 frozen), ``audio_tower.layers``."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.language_model = _Tower("layers", 2, dim)
        self.visual = _Tower("blocks", 2, dim)
        self.audio_tower = _Tower("layers", 2, dim)
        cast(nn.ModuleList, self.visual.blocks)[1].requires_grad_(False)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.language_model(x) + self.visual(x) + self.audio_tower(x))


def multimodal_blocks(model: _MultimodalModel) -> dict[str, tuple[_Block, bool]]:
    """Block name ("vision.1") -> (block, has a trainable parameter), taken before wrapping."""
    towers = {
        "language": cast(nn.ModuleList, model.language_model.layers),
        "vision": cast(nn.ModuleList, model.visual.blocks),
        "audio": cast(nn.ModuleList, model.audio_tower.layers),
    }
    return {
        f"{group}.{index}": (cast(_Block, block), any(p.requires_grad for p in block.parameters()))
        for group, container in towers.items()
        for index, block in enumerate(container)
    }


class _Buffered(nn.Module):
    """A linear layer plus a registered ``offset`` buffer; records the offset each forward sees."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.offset: torch.Tensor
        self.register_buffer("offset", torch.zeros(dim, dtype=torch.float64))
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.offset.detach().clone())
        return self.linear(x) + self.offset


class _SometimesUnused(nn.Module):
    """``used`` is always applied; ``skipped`` never is, so it gets no gradient."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.used = nn.Linear(dim, dim)
        self.skipped = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def bucket_model() -> nn.Module:
    """Six bias-free linear layers: once cast to float64, six parameters of 8 KiB (1024 elements) each."""
    # Six float64 parameters of 32*32*8 = 8 KiB each.
    return nn.Sequential(*(nn.Linear(32, 32, bias=False) for _ in range(6)))
