"""What the a2a suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Dispatched", "Exchanged"]


@dataclass(frozen=True)
class Exchanged:
    """One call of the all-to-all on a rank (:func:`~.ranks.exchanged`).

    ``out``: what it returned (a CPU tensor, or whatever else came back); ``requires_grad``: whether that requires
    grad; ``input_intact``: the input's bits unchanged. With a backward: ``grad``, the input's gradient (None
    where it got none, or without a backward) and ``grad_intact``, the output gradient passed to backward
    unchanged (True without a backward).
    """

    out: Any
    requires_grad: bool
    input_intact: bool
    grad: Any = None
    grad_intact: bool = True


@dataclass(frozen=True)
class Dispatched:
    """Tokens dispatched and combined back on a rank (:func:`~.ranks.dispatched`): what arrived (``received``),
    the ``combined`` tokens and the tokens' ``grad`` (CPU tensors, or whatever the target returned)."""

    received: Any
    combined: Any
    grad: Any
