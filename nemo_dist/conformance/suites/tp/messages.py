"""What the tp suite's ranks send the parent: typed, so that every read of a rank's report is checked by mypy.

A rank whose target raised sends no report: the parent reads the raise
(:mod:`~nemo_dist.conformance.adapters.target_raised`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Difference", "Heads", "Placed", "TPRun", "UnbuiltModel"]

#: ``(max |got - want|, max(1, max |want|), got's least-squares multiple of want)`` of a tensor against the
#: unsharded model's: :func:`~.ranks._difference`.
Difference = tuple[float, float, float]


@dataclass(frozen=True)
class Placed:
    """How one parameter is held: its ``placements`` (``repr`` of each; empty where it is a plain tensor) on the
    ``mesh`` dims (their names), its ``local`` and ``full`` shapes."""

    placements: list[str]
    local: tuple[int, ...]
    full: tuple[int, ...]
    mesh: list[str]


@dataclass(frozen=True)
class Heads:
    """An attention module with head counts of its own (``name``): its counts, ``head_dim``, and the local widths
    of its query and key projections (``k_width`` None without a key projection)."""

    name: str
    num_heads: int
    num_key_value_heads: int
    head_dim: int | None
    q_width: int
    k_width: int | None


@dataclass(frozen=True)
class UnbuiltModel:
    """The suite's tiny config does not fit the model's class (``unbuilt``: the error): no verdict on the target."""

    unbuilt: str
    tp: int
    dp: int


@dataclass(frozen=True)
class TPRun:
    """One rank's run of the sharded model beside the unsharded one (:func:`~.ranks.run`).

    On a ``tp`` x ``dp`` layout, this rank ``tp_rank`` in its tp group; ``tolerance``: the relative one of the
    compute dtype. After sharding: ``placements`` by parameter name, ``heads``, and whether the head is tied
    to the embedding before and after (``tied_before``, ``tied_after``; None where the model has no head).
    After the first forward: ``logits`` against the unsharded model's, their ``logits_digest`` and
    ``logits_form`` (their type and placements), and ``loss`` (``(got, unsharded)``); after its backward,
    ``grads`` by name (None where the full gradient is missing). After the steps (``steps``, as the spec gives
    them): ``params`` by name, the ``replicated`` parameters' digests, and ``tied_trained``.
    """

    placements: dict[str, Placed]
    heads: list[Heads]
    tied_before: bool | None
    tied_after: bool | None
    tp: int
    dp: int
    tolerance: float
    tp_rank: int
    logits: Difference
    logits_digest: str
    logits_form: str
    loss: tuple[float, float]
    grads: dict[str, Difference | None]
    params: dict[str, Difference]
    replicated: dict[str, str]
    tied_trained: bool | None
    steps: tuple[tuple[str, int], ...]
