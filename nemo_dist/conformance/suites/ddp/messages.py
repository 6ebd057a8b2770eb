"""What the ddp suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy.

Tensors travel as CPU copies, parameters and gradients in ``model.parameters()`` order (a gradient None where
a parameter has none); dtypes as torch names them (``"torch.float64"``). A rank function whose entry point
returned no DDP sends :class:`~nemo_dist.conformance.suites.ddp.entry_point.NotDDP` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "AutocastOps",
    "BlockRun",
    "BucketLayout",
    "BufferSync",
    "ConfigRun",
    "ContrastiveRun",
    "DiscoveryRun",
    "ManagerAttributes",
    "OpCounts",
    "Placement",
    "Recompute",
    "ScopeRun",
    "StaticRun",
    "UnusedParameter",
    "UnusedRun",
]

#: Gradients of a model's parameters, None where a parameter has none.
Grads = list[torch.Tensor | None]


@dataclass(frozen=True)
class ManagerAttributes:
    """A ``DDPManager`` built on a rank (:func:`~.ranks.manager_attributes`).

    ``rank`` and ``world_size``: the manager's beside torch's; ``device``: the manager's (``"<missing>"``
    without one); ``current_device``: the current CUDA device after it was built (None without CUDA);
    ``mirrored``: per config field, the manager's attribute (``"<missing>"`` without one) beside the config's.
    """

    rank: tuple[int, int]
    world_size: tuple[int, int]
    device: str
    current_device: int | None
    mirrored: dict[str, tuple[Any, Any]]


@dataclass(frozen=True)
class Placement:
    """What the entry point returned for a tiny float64 model, and where it lives (:func:`~.ranks.placement`).

    ``backend``; ``cuda_count``: the visible GPUs (0 without CUDA); ``current_device``: the current CUDA device
    after the entry point ran (None without CUDA); ``is_ddp``: a DistributedDataParallel came back, whose
    ``.module`` is the model (``module_is_model``), or the model itself (``is_model``); ``returned``: its type's
    name; ``param_devices`` and ``param_dtypes``: the parameters' (sorted, without repeats); ``device_ids``:
    the DDP's, as indices (None when not a DDP).
    """

    backend: str
    cuda_count: int
    current_device: int | None
    is_ddp: bool
    module_is_model: bool
    is_model: bool
    returned: str
    param_devices: list[str]
    param_dtypes: list[str]
    device_ids: Any


@dataclass(frozen=True)
class BufferSync:
    """A buffer set to the rank number before wrapping (:func:`~.ranks.buffer_sync`): what the rank holds after
    construction (``after_init``), what forward 1 saw, and what forward 2 saw after each rank set its buffer
    to rank + 10."""

    after_init: list[float]
    forward1: list[float]
    forward2: list[float]


@dataclass(frozen=True)
class BucketLayout:
    """One cap's buckets on step ``steps`` (:func:`~.ranks.bucket_layouts`): each bucket the indices of its
    parameters, of the entry point's DDP (``got``) and of torch's own DDP given the cap (``torch_ddp``), and
    their ``bucket_bytes_cap`` (``got_cap_bytes`` None where the DDP has none)."""

    got: list[list[int]]
    torch_ddp: list[list[int]]
    got_cap_bytes: Any
    torch_cap_bytes: int


@dataclass(frozen=True)
class UnusedRun:
    """Two SGD steps of a model whose forward skips a parameter (:func:`~.ranks.unused_parameter`): the DDP's
    ``error`` message (None where it raised none) and the parameters after the steps (``params``, [] on error)."""

    error: str | None
    params: list[torch.Tensor]


@dataclass(frozen=True)
class UnusedParameter(UnusedRun):
    """:class:`UnusedRun` through the entry point, and beside it (``torch_ddp``) through a plain
    ``DistributedDataParallel`` built with the same ``find_unused_parameters`` (:func:`~.ranks.unused_parameter`)."""

    torch_ddp: UnusedRun


@dataclass(frozen=True)
class StaticRun:
    """One setting of :func:`~.training.static_graph_training`.

    ``static_graph`` and ``default_static_graph``: the DDP objects' attribute with ``static_graph=True`` and
    by default; ``static`` and ``dynamic``: the parameters of both runs after the steps; ``error``: what DDP
    raised in the static run (None; ``static`` then [] where it raised).
    """

    static_graph: Any
    default_static_graph: Any
    static: list[torch.Tensor]
    dynamic: list[torch.Tensor]
    error: str | None


@dataclass(frozen=True)
class ContrastiveRun:
    """An encoder trained with a gathered InfoNCE loss, and a full-batch copy (:func:`~.training.contrastive_identity`).

    The gradients of step 1 (``ddp``, the copy's ``reference``), the parameters after the steps (``params``,
    ``reference_params``) and the wrapped model's ``dtype``.
    """

    ddp: Grads
    reference: Grads
    params: list[torch.Tensor]
    reference_params: list[torch.Tensor]
    dtype: str


@dataclass(frozen=True)
class ConfigRun:
    """The tiny model trained under a config and in one process on the full batch (:func:`~.training.train_config`):
    both parameter lists after the steps (``params``, ``reference``) and the wrapped model's ``dtype``."""

    params: list[torch.Tensor]
    reference: list[torch.Tensor]
    dtype: str


@dataclass(frozen=True)
class OpCounts:
    """The ops a block's counted sub-modules executed, ``(in forward, in backward)``: its ``matmuls`` and the
    ``others`` computing a tensor (views aside)."""

    matmuls: tuple[int, int]
    others: tuple[int, int]


@dataclass(frozen=True)
class BlockRun:
    """What one block ran (:func:`~.op_ranks.observe_blocks`; :mod:`~.checkpoint_rules` judges it).

    ``calls``: per counted sub-module by name, its ``forward`` runs ``(in forward, again in backward)``;
    ``ops``: what they executed in each, None where ops were not counted.
    """

    calls: dict[str, tuple[int, int]]
    ops: OpCounts | None = None


@dataclass(frozen=True)
class ScopeRun:
    """The model checkpointed with one scope (:func:`~.op_ranks.checkpoint_recompute`): per block its ``runs``
    (:class:`BlockRun`), and the ``grads``."""

    runs: dict[str, BlockRun]
    grads: Grads


@dataclass(frozen=True)
class Recompute:
    """Checkpointing of the hand-made model, per scope (:func:`~.op_ranks.checkpoint_recompute`).

    ``trainable``: per block, whether it trains; ``plain_grads``: the gradients of the model wrapped without
    checkpointing; ``dtype``: the wrapped model's parameter dtype; ``scopes``: by ``repr(scope)``, its run.
    """

    trainable: dict[str, bool]
    plain_grads: Grads
    dtype: str
    scopes: dict[str, ScopeRun]


@dataclass(frozen=True)
class AutocastOps:
    """A train step of a float32 tiny model under an ``autocast_dtype`` (:func:`~.op_ranks.autocast_ops`).

    ``params``: the parameter dtypes after wrapping; ``output``: the wrapped output's dtype and
    ``reference_output`` the one ``torch.autocast`` gives the same model; ``matmuls`` and ``backward_matmuls``:
    the output dtype of every matmul of the forward and of the backward; ``floating``: ``"op: dtype"`` of every
    floating-point output of the forward; ``grad_dtypes``; ``grads``, and the ``reference`` gradients of one
    process on the full batch under an explicit ``torch.autocast``.
    """

    params: list[str]
    output: str
    reference_output: str
    matmuls: list[str]
    backward_matmuls: list[str]
    floating: list[str]
    grad_dtypes: list[str]
    grads: Grads
    reference: Grads


@dataclass(frozen=True)
class DiscoveryRun:
    """Full checkpointing of scope "all" on the discovery model (:func:`~.discovery.discovery_recompute`).

    ``recomputed``: per block, its attention's and MLP's runs in backward; ``grads``, and ``plain_grads`` of
    the same model wrapped without checkpointing; ``dtype``: the wrapped model's.
    """

    recomputed: dict[str, tuple[int, int]]
    grads: Grads
    plain_grads: Grads
    dtype: str
