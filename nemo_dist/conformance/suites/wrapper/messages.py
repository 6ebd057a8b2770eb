"""What the wrapper suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy.

Parameters and gradients travel flattened (weight rows, then bias) as float64 CPU tensors, None where the
wrapper left none; dtypes as torch names them (``"torch.float64"``), an output's without the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["AccumulationReport", "BufferViews", "FirstCall", "NestedReport", "StartReport", "Stepped", "TrainReport"]

#: A flattened gradient, or None where a parameter had none.
Flat = torch.Tensor | None


@dataclass(frozen=True)
class FirstCall:
    """One rank's first wrap and training step of a small model (:func:`~.ranks.first_call`).

    ``error``: ``Type: message`` of a failure ("" without); ``wrapped``: whether the wrapping itself returned
    (False when ``error`` is its); ``need``: the one-line message when the world lacks CUDA or a launcher
    variable; ``refused``: Python refused the call's arguments (the ``TypeError``); ``returned``: what came
    back; ``ddp_at`` and ``ddp``: where a DistributedDataParallel sits inside and its settings ("" without);
    ``missing``: the step-protocol methods (option field, method name) what came back lacks; ``dtype``: the
    parameters' dtype after wrapping; ``accumulates``: ``no_sync``, ``set_requires_gradient_sync`` or "";
    ``sharding``: how each parameter is held (:func:`~nemo_dist.conformance.suites.ddp.sharded.sharding`; empty
    when none is a DTensor).
    """

    error: str = ""
    wrapped: bool = False
    need: str = ""
    refused: str = ""
    returned: str = ""
    ddp_at: str = ""
    ddp: str = ""
    missing: list[tuple[str, str]] = field(default_factory=list)
    dtype: str = ""
    accumulates: str = ""
    sharding: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StartReport:
    """A wrapped model's parameters before (``own``, rounded to ``dtype``, the wrapped model's) and after one
    forward without grad (``after``) (:func:`~.ranks.start`)."""

    own: torch.Tensor
    after: torch.Tensor
    dtype: str


@dataclass(frozen=True, kw_only=True)
class Stepped:
    """What every report of a wrapper's training steps carries.

    ``dtype``: the wrapped model's parameters'; ``output_dtype``: its forward's output's; ``reduced``: the
    gradient reductions the backend ran in the (first, or synced) backward, ``(event, dtype)``
    (:func:`~.ranks.reductions`); ``divide_factors``: the FSDP2 divide factors the wrapper set
    (:func:`~.torch_faults.divide_factor_state`; empty where none).
    """

    dtype: str = ""
    output_dtype: str = ""
    reduced: list[tuple[str, str]] = field(default_factory=list)
    divide_factors: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TrainReport(Stepped):
    """SGD steps through the wrapper beside one process (:func:`~.ranks.train`).

    ``own``: the rank's initial weights; ``start``: the parameters after the first forward (None without a
    step); per step,
    ``params`` after it, the gradient the wrapper left (``grads``), this rank's local gradient (``locals``)
    and the full-batch one under the declared reduction (``expected``), both computed here from the same
    parameters; ``reference``: the full-batch run from rank 0's weights, per step; ``layout``: ``(name,
    numel, is a DTensor)`` per parameter, in the flattened order.
    """

    own: torch.Tensor
    start: torch.Tensor | None
    params: list[torch.Tensor]
    grads: list[Flat]
    locals: list[torch.Tensor]
    expected: list[torch.Tensor]
    reference: list[torch.Tensor]
    layout: list[tuple[str, int, bool]]


@dataclass(frozen=True, kw_only=True)
class AccumulationReport(Stepped):
    """Micro-batches accumulated without syncing, then one synced (:func:`~.ranks.accumulation`).

    ``offered``: the wrapper's way to skip the sync (``no_sync``, ``set_requires_gradient_sync``), None where
    it offers neither (then nothing else is filled); ``grad``: the gradient the wrapper left; ``expected``:
    one big step's on every micro-batch of every rank; the candidates of a wrong one: the synced micro-batch
    alone (``last_only``), the local accumulation plus the reduced last micro-batch
    (``unreduced_accumulation``), this rank's accumulation with no reduction (``local_accumulation``);
    ``unsynced_reductions``: the reductions the backend ran during the unsynced micro-batches.
    """

    offered: str | None = None
    grad: Flat = None
    expected: torch.Tensor | None = None
    last_only: torch.Tensor | None = None
    unreduced_accumulation: torch.Tensor | None = None
    local_accumulation: torch.Tensor | None = None
    unsynced_reductions: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class NestedReport(Stepped):
    """The nested model trained through the wrapper beside one process (:func:`~.nested.nested_training`).

    ``names``: its parameter names; ``params`` and ``reference``: every parameter after each step (CPU
    copies, whole where sharded), the wrapper's and one process's; ``modes``: the train modes each forward
    saw (model, dropout); ``other_first``: one process's parameters after the first step under the other
    reduction.
    """

    names: list[str] = field(default_factory=list)
    params: list[list[torch.Tensor]] = field(default_factory=list)
    reference: list[list[torch.Tensor]] = field(default_factory=list)
    modes: list[tuple[bool, bool]] = field(default_factory=list)
    other_first: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class BufferViews:
    """What the wrapped model's buffer-reading layer saw in each forward (:func:`~.ranks.buffer_views`)."""

    seen: list[float]
