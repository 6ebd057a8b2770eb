"""What the moe suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy.

Differences are relative (:func:`~nemo_dist.conformance.suites.moe.reading.difference`): None where the shapes differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Differences", "Probe", "RunReport"]

#: A relative difference by tensor name (None: shapes differ).
Differences = dict[str, float | None]


@dataclass(frozen=True)
class Probe:
    """How the target lays the layer out on one rank, before any forward (:func:`~.ranks.placements`).

    ``placements``: each parameter's ``Shard(0)``, ``plain``, rank-local rows..., or the error the target raised
    (a string); ``held``: the experts this rank holds (None where nothing says); ``routing``: ``(num_experts,
    top_k)`` of a layer whose routing the suite can steer; ``start``: each parameter whole against the unsharded
    layer's; ``chunks_wrong`` and ``local_problems``: what sharding did wrong (empty where the target raised).
    """

    placements: dict[str, str] | str
    held: list[int] | None
    routing: tuple[int, int] | None
    start: Differences = field(default_factory=dict)
    chunks_wrong: list[str] = field(default_factory=list)
    local_problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunReport:
    """One rank's run of a scenario (:func:`~.ranks.run`): the expert-parallel layer against one process.

    ``out``, ``aux`` (None without an auxiliary loss), ``tokens_grad``, ``grads`` (by parameter) and ``steps``
    (each parameter after the optimizer steps): relative differences; ``received_pairs``: how many pairs one
    process routes to the experts this rank holds (None where unknown); ``replicated_digests`` and
    ``shard_digests``: a digest of each replicated parameter, and of each shard with the part it holds, after the
    steps; ``values``: the diagnosis (:func:`~.evidence.diagnosis`) where asked for, else None.
    """

    placements: dict[str, str]
    chunks_wrong: list[str]
    local_problems: list[str]
    received_pairs: int | None
    start: Differences
    tokens_grad: float | None
    out: float | None
    aux: float | None
    has_aux: bool
    grads: Differences
    steps: Differences
    replicated_digests: dict[str, str]
    shard_digests: dict[str, tuple[Any, str]]
    values: dict[str, Any] | None = None
