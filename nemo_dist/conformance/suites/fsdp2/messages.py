"""What the fsdp2 suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy.

Parameters travel whole (``full_tensor()``) as CPU copies, in ``model.parameters()`` order (a gradient None
where a parameter has none); dtypes by their names without the ``torch.`` prefix; FSDP units by their names in
the model ("" the root).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_dist.conformance.suites.ddp.messages import BlockRun

__all__ = [
    "Accumulation",
    "Checkpointing",
    "DTensorPlacement",
    "Dtypes",
    "FunctionalLayout",
    "Groups",
    "HeldPolicies",
    "Offload",
    "ShardedParam",
    "Sharding",
    "StateDicts",
    "StepRun",
    "SyncRun",
    "Trained",
]


@dataclass(frozen=True)
class DTensorPlacement:
    """How a DTensor parameter is laid out on a rank: its ``placements`` (``repr`` of each), the names of its mesh
    ``dims``, the ranks of each mesh dim's group (``groups``) and the rows it holds locally (``local_rows``)."""

    placements: list[str]
    dims: list[str]
    groups: list[list[int]]
    local_rows: int


@dataclass(frozen=True)
class ShardedParam:
    """How one parameter is held (:func:`~.ranks.sharding`): its ``name``, its unsharded row count (``rows``),
    whether its full tensor equals the unsharded model's (``full_equal``) and, for a DTensor, its ``placed``
    layout (None for a plain tensor)."""

    name: str
    rows: int
    full_equal: bool
    placed: DTensorPlacement | None


@dataclass(frozen=True)
class Groups:
    """A rank's expected ``shard`` group and ``replicate`` group (global ranks) in the ``(R, W/R)`` layout."""

    shard: list[int]
    replicate: list[int]


@dataclass(frozen=True)
class Sharding:
    """A model sharded with mixed precision off (:func:`~.ranks.sharding`): whether the entry point returned the
    model itself (``returned_model``), each parameter's :class:`ShardedParam` and the rank's ``expected``
    groups."""

    returned_model: bool
    params: list[ShardedParam]
    expected: Groups


@dataclass(frozen=True)
class Trained:
    """Steps sharded and in one process on the whole batch (:func:`~.ranks.training`): both models' final
    parameters (``params``, ``expected``), the parameters whose replicas differ under HSDP (``replicas_differ``)
    and whether ``head.weight`` is still ``embed.weight`` (``tied``)."""

    params: list[torch.Tensor]
    expected: list[torch.Tensor]
    replicas_differ: list[str]
    tied: bool


@dataclass(frozen=True)
class FunctionalLayout:
    """A model sharded through ``fsdp2_strategy_parallelize`` alone (:func:`~.ranks.functional_layout`): the
    ``prefetch`` chains set, as ``(direction, unit, the units it prefetches)``, and per unit with parameters
    whether it was resharded after forward (``resharded``)."""

    prefetch: list[tuple[str, str, list[str]]]
    resharded: dict[str, bool]


@dataclass(frozen=True)
class Dtypes:
    """A float32 model's step under a mixed-precision policy (:func:`~.ranks.precision`).

    ``compute``: the first layer's MLP weight's in its forward; ``output``: the logits'; ``layer_input``: what
    the first layer's attention received ("?" where a hook did not run); ``params``, ``grads`` and ``state``
    (Adam's): the sharded ones', each sorted without repeats; ``reductions``: the gradient reductions the
    backend ran, ``(event, dtype)`` (:func:`~nemo_dist.conformance.suites.wrapper.ranks.reductions`).
    """

    compute: str
    output: str
    layer_input: str
    params: list[str]
    grads: list[str]
    state: list[str]
    reductions: list[tuple[str, str]]


@dataclass(frozen=True)
class SyncRun:
    """Micro-batches accumulated through ``get_sync_ctx`` in one mode, deferred or eager (:func:`~.ranks.accumulation`):
    the gradient ``reductions`` the backend ran over all of them, how many parameters ``held`` a gradient after
    each, and the final full ``grads``."""

    reductions: int
    held: list[int]
    grads: list[torch.Tensor | None]


@dataclass(frozen=True)
class Accumulation:
    """Both modes of :func:`~.ranks.accumulation` (``deferred``, ``eager``), one process's gradients of the same
    micro-batches summed (``expected``), and the number of parameters (``params``)."""

    deferred: SyncRun
    eager: SyncRun
    expected: list[torch.Tensor | None]
    params: int


@dataclass(frozen=True)
class StateDicts:
    """A trained model's state dicts (:func:`~.ranks.state_dicts`): the full state dict's ``keys`` and tensor
    values by key (``whole``), the unsharded model's keys (``expected_keys``), and by name the full parameters
    of the trained model (``first``) and of another sharded model after loading its sharded state dict
    (``second``)."""

    keys: list[str]
    expected_keys: list[str]
    whole: dict[str, torch.Tensor]
    first: dict[str, torch.Tensor]
    second: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Offload:
    """A model sharded with an offload policy or none (:func:`~.ranks.offload`): each unit's offload policy, its
    type's name (``policies``), and the device types its sharded parameters live on (``devices``)."""

    policies: dict[str, str]
    devices: list[str]


@dataclass(frozen=True)
class StepRun:
    """One step of a sharded model (:func:`~.ranks.checkpointing`): per block its run (``runs``), and the
    ``grads``."""

    runs: dict[str, BlockRun]
    grads: list[torch.Tensor | None]


@dataclass(frozen=True)
class Checkpointing:
    """The same step sharded without checkpointing (``plain``) and with it (``checkpointed``)
    (:func:`~.ranks.checkpointing`)."""

    plain: StepRun
    checkpointed: StepRun


@dataclass(frozen=True)
class HeldPolicies:
    """A float32 side-input model sharded with a policy (:func:`~.policy_ranks.held_policies`).

    ``units``: per unit, the fields of the ``MixedPrecisionPolicy`` FSDP holds for it (a dtype's name, None or a
    bool, by field name); ``layers``: per layer, the dtypes of the residual stream and of the float32 side
    input its first forward received.
    """

    units: dict[str, dict[str, Any]]
    layers: list[list[str]]
