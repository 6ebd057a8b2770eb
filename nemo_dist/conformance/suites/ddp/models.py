"""The small seeded models the DDP checks train: transformer-like blocks that count their forward calls.

Built on CPU in float64 by the rank functions (:mod:`~nemo_dist.conformance.suites.ddp.ranks`,
:mod:`~nemo_dist.conformance.suites.ddp.training`);
the attention and _MLP of each block count how often their ``forward`` runs,
so checkpointing shows as extra calls during backward, and mark themselves
running (:func:`running`) so that :class:`~nemo_dist.conformance.suites.ddp.ops.MatmulCounter`
can count the matmuls each one executes. Each has one linear layer with a bias
(``aten.addmm``) and one without (``aten.mm``): a selective policy that saves
every other ``mm`` (upstream's) shows as fewer recomputed matmuls, as does one
that saves every matmul (nemo_dist's).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

# The model classes keep their leading underscore: their names appear in verdicts
# ("the entry point returned _TinyModel, not DistributedDataParallel").
__all__ = ["BUCKET_WIDTH", "DIM", "bucket_model", "multimodal_blocks", "running"]

#: Feature width of the models.
DIM = 8
#: Width of the square bias-free layers of :func:`bucket_model`.
BUCKET_WIDTH = 16

# The counted sub-modules whose forward is running, innermost last. A recompute in
# backward may run on an autograd thread; one forward runs at a time, so a plain list serves.
_RUNNING: list[_Counted] = []


def running() -> _Counted | None:
    """The innermost counted sub-module whose ``forward`` is running now, if any."""
    return _RUNNING[-1] if _RUNNING else None


class _Counted(nn.Module):
    """A sub-module that counts its ``forward`` calls (``calls``) and names itself :func:`running` meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        _RUNNING.append(self)
        try:
            return self.compute(x)
        finally:
            _RUNNING.pop()

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """The sub-module's computation."""
        raise NotImplementedError


class _Attention(_Counted):
    """Row-wise attention-like mixing; counts its forward calls (recompute included)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim, bias=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of the query times the value."""
        return torch.softmax(self.query(x), dim=-1) * self.value(x)


class _MLP(_Counted):
    """Two-layer tanh _MLP; counts its forward calls."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """Up, tanh, down."""
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


class _SelfCheckpointed(_TinyModel):
    """:class:`_TinyModel` whose blocks checkpoint themselves (non-reentrant): checkpointing no wrapper applied."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=False)
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
    """24 bias-free square linear layers: once cast to float64, 24 parameters of 2 KiB (256 elements) each."""
    return nn.Sequential(*(nn.Linear(BUCKET_WIDTH, BUCKET_WIDTH, bias=False) for _ in range(24)))
