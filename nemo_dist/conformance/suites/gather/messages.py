"""What the gather suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy.

Tensors travel as CPU copies (None where there was none); ``out`` is the gathered output as the concatenation
(:meth:`~.target.GatherTarget.gather`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Alone",
    "AutogradParts",
    "BackwardRun",
    "BothGathers",
    "FirstCall",
    "Gathered",
    "GroupGathered",
    "PrecisionRun",
]


@dataclass(frozen=True)
class FirstCall:
    """A first call of a ``--gather-fn`` callable on a rank, as text (:func:`~.ranks.first_call`).

    ``form``: the form of its gathered value ("cat", "tuple" or "stacked"); ``missing``: the parameters a
    "missing required argument" ``TypeError`` named, joined by commas; ``error``: any other exception, or a
    value that is no gathered form, as ``Type: message``; ``cuda``: for a call on a CPU tensor whose failure
    says it needs a GPU, the evidence :func:`~nemo_dist.conformance.needs_gpu.gpu_need` found. Each "" where it
    does not apply; all "" when no callable is checked.
    """

    form: str = ""
    missing: str = ""
    error: str = ""
    cuda: str = ""


@dataclass(frozen=True)
class Gathered:
    """One gather on a rank (:func:`~.ranks.forward`): its output ``out``, whether that ``requires_grad``, and
    whether the caller's input kept its bits (``input_intact``)."""

    out: torch.Tensor | None
    requires_grad: bool
    input_intact: bool


@dataclass(frozen=True)
class BackwardRun:
    """One gather with grad and a loss's backward on a rank (:func:`~.ranks.backward`).

    ``grad``: the input's gradient; ``input_intact`` and ``grad_intact``: whether the input and the upstream
    gradient kept their bits; ``out_grad``: the gradient retained on the gathered output, None where the output
    is a leaf (the identity of a world of one).
    """

    grad: torch.Tensor | None
    input_intact: bool
    grad_intact: bool
    out_grad: torch.Tensor | None


@dataclass(frozen=True)
class PrecisionRun:
    """One dtype's example of :func:`~.ranks.precision` on a rank: the output ``out`` and the input's ``grad``."""

    out: torch.Tensor | None
    grad: torch.Tensor | None


@dataclass(frozen=True)
class AutogradParts:
    """``_AllGatherWithGrad.apply(x)`` on a rank (:func:`~.ranks.autograd_function`): the ``parts`` it returned
    and the input's ``grad``."""

    parts: list[torch.Tensor | None]
    grad: torch.Tensor | None


@dataclass(frozen=True)
class BothGathers:
    """A gather with grad and its backward, then one without grad, on a rank (:func:`~.ranks.uneven`,
    :func:`~.ranks.grouped`): the first's ``out`` and the input's ``grad``; the no-grad gather's output
    (``no_grad_out``) and whether it requires grad (``no_grad_requires_grad``)."""

    out: torch.Tensor | None
    grad: torch.Tensor | None
    no_grad_out: torch.Tensor | None
    no_grad_requires_grad: bool


@dataclass(frozen=True)
class GroupGathered:
    """A gather over the rank's group, no backward (:func:`~.ranks.grouped_forward`): the rows it gathered
    (``out``), even where a backward would fail on the output's shape."""

    out: torch.Tensor | None


@dataclass(frozen=True)
class Alone:
    """A gather with nothing to gather: no process group, or a world of one (:func:`~.ranks.alone`).

    ``is_x``: whether ``all_gather_with_grad(x)`` returned ``x`` itself; ``no_grad_out``: what
    ``all_gather_no_grad(x)`` returned, and whether it requires grad (``no_grad_requires_grad``).
    """

    is_x: bool
    no_grad_out: torch.Tensor | None
    no_grad_requires_grad: bool
