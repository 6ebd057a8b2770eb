"""What the pp suite's ranks send the parent: typed, so that every read of a rank's report is checked by mypy.

A rank whose target raised sends no report: the parent reads the raise
(:mod:`~nemo_dist.conformance.adapters.target_raised`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AccumulationRun",
    "DataParallelRun",
    "Difference",
    "KeywordRun",
    "Misplacement",
    "NormTwice",
    "PipelineRun",
    "StageKeywords",
]

#: ``(max |got - want|, max(1, max |want|), got's least-squares multiple of want, what that multiple leaves)``:
#: :func:`~.ranks.difference`.
Difference = tuple[float, float, float, float]


@dataclass(frozen=True)
class Misplacement:
    """Where a pipeline's stages are not where their stage maps run them, as every rank of it found alike before
    any step (:func:`~.placement.misplacement`): ``what`` is wrong, stage by stage, and the ``cause`` the layout
    proves (a placement exactly round robin where the maps run a V, or the reverse), else None."""

    what: str
    cause: str | None = None


@dataclass(frozen=True)
class NormTwice:
    """One process with its final norm applied twice, against this rank's first step: ``loss`` (the variant's,
    where the rank reports one) and ``grads`` (each held parameter's gradient against the variant's)."""

    loss: float | None
    grads: dict[str, Difference]


@dataclass
class PipelineRun:
    """One rank's build and steps of the target's pipeline beside one process (:func:`~.ranks.run`).

    ``held``: ``(stage index, name in the stage, the model's name or None)`` of every parameter this rank's
    stages hold; ``stages``: their indices; ``microbatches`` and ``tokens`` (the batch's label tokens);
    ``names``: the model's parameter names; ``tolerance``: the relative one of the compute dtype;
    ``misplaced``: where the stages are not where the schedule runs them (nothing is stepped then);
    ``schedule``: the built schedule's class name. After the first step: ``loss`` (``(got, one process's)``,
    where this rank's last stage reports one), ``grads`` (by label: each held parameter's gradient against one
    process's, None where it got none and one process's is nonzero), ``copies`` and ``want_copies`` (the
    gradients of each stage's copy of a tied weight, and one process's), ``norm_twice`` (only where the first
    step is off). After the second: ``carried`` (:func:`~.ranks._carried`). After the last: ``params`` (each
    held parameter against one process's, None where unknown) and ``steps`` (the optimizers, in order).
    """

    held: list[tuple[int, str, str | None]]
    stages: list[int]
    microbatches: int
    tokens: int
    names: list[str]
    tolerance: float
    misplaced: Misplacement | None = None
    schedule: str = ""
    loss: tuple[float, float] | None = None
    grads: dict[str, Difference | None] = field(default_factory=dict)
    copies: list[tuple[int, str | None, Any]] = field(default_factory=list)
    want_copies: dict[str, Any] = field(default_factory=dict)
    norm_twice: NormTwice | None = None
    carried: tuple[float, float] | None = None
    params: dict[str, Difference | None] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StageKeywords:
    """One stage of the pipeline as every rank sees it (gathered): its ``index``, whether its module's forward
    takes the keyword input (``takes``), that forward's ``signature``, and the ``layers`` it holds (``layers.3``)."""

    index: int
    takes: bool
    signature: str
    layers: tuple[str, ...]


@dataclass
class KeywordRun:
    """One rank's step of the target's pipeline given packed ``position_ids`` as keyword inputs, beside one process
    given the same (:func:`~.keywords.run`).

    ``stages``: every stage of the pipeline (all ranks', gathered), in index order; ``model_takes``: whether the
    model's own forward takes the keyword (the one process needs it); ``stepped``: whether the step ran (not
    where a stage or the model takes no such keyword). ``loss``: ``(got, one process's)`` where this rank's last
    stage reports one; ``grads``: each held parameter's gradient against one process's, by ``(stage index,
    label)``; ``first_only``: the same against one process whose layers outside the first stage ran with their
    default positions (``first_only_loss`` its loss), on the suite's own model only; ``tolerance``: the relative
    one of the compute dtype.
    """

    stages: list[StageKeywords]
    model_takes: bool
    tolerance: float
    stepped: bool = False
    misplaced: Misplacement | None = None
    loss: tuple[float, float] | None = None
    grads: dict[tuple[int, str], Difference | None] = field(default_factory=dict)
    first_only: dict[tuple[int, str], Difference | None] | None = None
    first_only_loss: float | None = None


@dataclass
class DataParallelRun:
    """One rank's steps of the target's pipeline composed with data parallelism on a ``("pp", "dp")`` mesh, beside
    one process given every ``dp`` rank's rows (:func:`~.data_parallel.run`).

    ``pp`` and ``dp``: the mesh's sizes, ``dp_rank`` this rank's place on ``dp``, ``stages`` this rank's stage
    indices; ``units``: each held parameter's label -> the FSDP2 unit managing it (``stage 0's root``,
    ``layers.3``), empty where the stages hold no FSDP2 unit; ``tolerance``: the relative one of the compute dtype.
    After the first step: ``grads`` (each held parameter's full gradient against one process's) and, only where
    some differ, ``unreduced`` (the same against one process given this rank's rows alone, scaled as an unreduced
    ``dp`` rank's would be). After the last: ``params`` and ``steps``, as :class:`PipelineRun`'s.
    """

    pp: int
    dp: int
    dp_rank: int
    stages: list[int]
    tolerance: float
    units: dict[str, str] = field(default_factory=dict)
    misplaced: Misplacement | None = None
    grads: dict[str, Difference | None] = field(default_factory=dict)
    unreduced: dict[str, Difference | None] | None = None
    params: dict[str, Difference | None] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)


@dataclass
class AccumulationRun:
    """One rank's two schedule steps accumulated before one optimizer step, beside one process
    (:func:`~.accumulation.run`): ``microbatches`` a step, ``tolerance`` (the compute dtype's), ``misplaced`` (as
    :class:`PipelineRun`'s); ``grads``: each held parameter's gradient against one process's; ``fit``: ``(a, b,
    residual)``, every held gradient as ``a`` times the first step's part plus ``b`` times the second's (both 1
    where right), None where not determined.
    """

    microbatches: int
    tolerance: float
    misplaced: Misplacement | None = None
    grads: dict[str, Difference | None] = field(default_factory=dict)
    fit: tuple[float, float, float] | None = None
