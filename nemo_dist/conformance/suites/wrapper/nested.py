"""Rank side of ``wrapper.trains_a_nested_model``: a model shaped like real ones, trained through the wrapper.

The other wrapper checks train one flat ``Linear``, called positionally: a
wrapper that syncs only ``nn.Linear`` layers, only the root module's own
parameters, drops keyword arguments or switches the model to eval mode
passes them. :class:`NestedModel` has a parameter of the root module itself,
nested children (an embedding, a linear layer and a norm inside a
``Sequential``, a linear head), a buffer, a dropout whose train mode it
records, and a keyword-only argument to ``forward``. :func:`nested_training`
trains it for :data:`NESTED_STEPS` steps from the same weights on every rank
and trains a copy in this process on the full batch beside it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import cpu_copy, dtype_of
from nemo_dist.conformance.suites.ddp.templates import manual_seed
from nemo_dist.conformance.suites.ddp.wrapped import backward, held, rank_device, sgd, wrap
from nemo_dist.conformance.suites.wrapper.messages import NestedReport
from nemo_dist.conformance.suites.wrapper.ranks import _loss, _scale, _wrapper

__all__ = ["NESTED_STEPS", "NestedModel", "nested_training"]

#: Steps trained: enough for parameters a wrapper leaves unsynced to drift apart visibly.
NESTED_STEPS = 4
_VOCAB, _DIM, _ROWS, _LR, _SEED = 7, 4, 2, 0.125, 31


class NestedModel(nn.Module):
    """A root parameter, nested children of three kinds, a buffer, a dropout, and a keyword-only ``shift``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(_DIM))
        self.embed = nn.Embedding(_VOCAB, _DIM)
        self.body = nn.Sequential(nn.Linear(_DIM, _DIM), nn.LayerNorm(_DIM))
        self.drop = nn.Dropout(p=0.0)  # p=0: deterministic; only its train mode is observed
        self.head = nn.Linear(_DIM, 1)
        self.register_buffer("offset", torch.full((_DIM,), 0.5))
        #: ``self.training`` and the dropout's, at each forward.
        self.modes: list[tuple[bool, bool]] = []

    def forward(self, tokens: torch.Tensor, *, shift: torch.Tensor) -> torch.Tensor:
        self.modes.append((self.training, self.drop.training))
        hidden = self.embed(tokens) * self.scale + shift + self.offset
        return self.head(self.drop(self.body(hidden))).squeeze(-1)


def _batch(rows: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1_000 + step)
    tokens = torch.randint(0, _VOCAB, (rows,), generator=generator)
    return tokens, torch.randn(rows, _DIM, generator=generator, dtype=torch.float64)


def _built() -> NestedModel:
    manual_seed(_SEED)
    return NestedModel().double()


def _reference_step(model: nn.Module, tokens: torch.Tensor, shift: torch.Tensor, scale: float, size: int) -> None:
    """One SGD step of ``model`` in this process on every rank's rows, each rank's loss times ``scale``."""
    model.zero_grad(set_to_none=True)
    for r in range(size):
        rows = slice(r * _ROWS, (r + 1) * _ROWS)
        (scale * _loss(model(tokens[rows], shift=shift[rows]))).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(_LR * p.grad)


def _one_step_other_reduction(reduction: str, size: int, device: torch.device, dtype: torch.dtype) -> list[Any]:
    """The one-process parameters after the first step under the reduction not declared (a sum for a mean)."""
    model = _built().to(device, dtype)
    tokens, shift = _batch(_ROWS * size, 0)
    other = "sum" if reduction == "mean" else "mean"
    _reference_step(model, tokens.to(device), shift.to(device, dtype), _scale(other, size), size)
    return [cpu_copy(p) for p in model.parameters()]


def nested_training(impl: Implementation) -> NestedReport:
    """Train :class:`NestedModel` through the wrapper for :data:`NESTED_STEPS` steps; the one-process run beside.

    Every rank starts from the same weights; step s's global batch is the
    same on every rank, and rank r trains on its rows (tokens and the
    keyword ``shift``). Returns the parameter names, the parameters after
    each step (``params``: CPU copies, whole where sharded), the one-process
    reference after each step (``reference``: the full batch, each rank's
    loss scaled as the declared reduction says), the train modes each
    forward saw (``modes``), the dtype of the wrapped model and of its output (``output_dtype``), and the
    one-process parameters after the first step under the other reduction (``other_first``: a sum where a
    mean is declared, and the reverse).
    """
    wrapper = _wrapper(impl)
    rank, size = dist.get_rank(), dist.get_world_size()
    model = _built()
    model.train()
    wrapped = wrap(wrapper, model)
    device, dtype = rank_device(), dtype_of(model)
    reference = _built().to(device, dtype)
    scale = _scale(wrapper.reduction, size)
    names = [n for n, _ in wrapped.model.named_parameters()]
    params: list[list[torch.Tensor]] = []
    references: list[list[torch.Tensor]] = []
    output_dtype = ""
    for step in range(NESTED_STEPS):
        tokens, shift = _batch(_ROWS * size, step)
        tokens, shift = tokens.to(device), shift.to(device, dtype)
        mine = slice(rank * _ROWS, (rank + 1) * _ROWS)
        out = wrapped.trained(tokens[mine], shift=shift[mine])
        output_dtype = str(out.dtype).removeprefix("torch.")
        backward(wrapped, _loss(out))
        sgd(wrapped, _LR)
        params.append(held(wrapped))
        _reference_step(reference, tokens, shift, scale, size)
        references.append([cpu_copy(p) for p in reference.parameters()])
    return NestedReport(
        names=names, params=params, reference=references, output_dtype=output_dtype, dtype=str(dtype),
        other_first=_one_step_other_reduction(wrapper.reduction, size, device, dtype),
        modes=getattr(wrapped.model, "modes", model.modes),
    )
