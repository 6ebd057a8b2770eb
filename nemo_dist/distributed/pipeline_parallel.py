"""Pipeline parallelism with NeMo AutoModel's contract, on torch's ``torch.distributed.pipelining``.

The model is split into stages as torchtitan splits it: its parts run in
order (``tok_embeddings``, the blocks of ``layers``, ``norm``, ``output`` by
default), ``layers`` is an ``nn.ModuleDict`` keyed by layer index, and a
stage is a copy of the model with the parts it does not hold set to ``None``
and the layers it does not hold deleted (so every parameter keeps its name).
The model's forward must skip a part that is ``None``.

- :func:`split_layers` gives each stage a contiguous run of layers, every
  layer exactly once; uneven counts put one more layer on the first stages.
- :func:`stage_indices` places stages on ranks: round robin (``loop``) for
  the interleaved schedules, a ``V`` for ZBVZeroBubble and DualPipeV.
- :func:`schedule_class` names torch's schedules (GPipe, 1F1B,
  Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).
- :func:`build_pipeline` makes this rank's stages and the schedule.

The loss contract is upstream's: ``loss_fn`` sums the loss over a
microbatch's label tokens (:func:`token_sum_loss`), the schedule does not
scale gradients (``scale_grads=False``), and after the schedule's step the
training loop divides every gradient by the label tokens of the whole batch
over the data-parallel size (:func:`scale_grads_by_tokens`). The result is
then the one-process token mean whatever the microbatches hold.

Tied embeddings (a head sharing the embedding's weight) are refused with a
``ValueError`` on every rank, before any communication: the first and last
stage would each hold a copy, and nothing here keeps the copies in sync.

Composed with data parallelism as upstream composes them (``dp_mesh``): on a
``("pp", "dp")`` mesh every stage is sharded with FSDP2 over its ``dp`` group
before it becomes a ``PipelineStage`` (:func:`shard_stage`: each layer a unit
of its own, then the stage's root, none resharded after forward, so the
microbatches share one all-gather). FSDP2 averages the gradients over the
``dp`` ranks when the schedule's last backward ends; each ``dp`` rank feeds
its own rows, and the training loop divides by the label tokens of the whole
batch (every ``dp`` rank's) over the ``dp`` size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FIRST_PARTS",
    "LAST_PARTS",
    "LAYERS",
    "SCHEDULES",
    "V_SCHEDULES",
    "build_pipeline",
    "count_label_tokens",
    "refuse_tied_embeddings",
    "scale_grads_by_tokens",
    "schedule_class",
    "shard_stage",
    "split_layers",
    "stage_indices",
    "stage_module",
    "token_sum_loss",
]

#: torch's schedules by name: one stage per rank, then several (the multi-stage ones).
SCHEDULES: tuple[str, ...] = (
    "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
)
#: The schedules of one stage per rank.
_SINGLE = ("GPipe", "1F1B")
#: The schedules whose two stages per rank sit in a V (rank r holds stages r and 2 * pp - 1 - r).
V_SCHEDULES: tuple[str, ...] = ("ZBVZeroBubble", "DualPipeV")
#: The parts the first stage holds before its layers, the last stage after them, and the layers' attribute.
FIRST_PARTS: tuple[str, ...] = ("tok_embeddings",)
LAST_PARTS: tuple[str, ...] = ("norm", "output")
LAYERS = "layers"
#: The label value a loss ignores (torch's cross entropy default).
_IGNORE = -100


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Each stage's layers, contiguous and in order, every layer in exactly one stage.

    ``num_layers % num_stages`` stages (the first ones) hold one layer more
    than the others: 5 layers over 2 stages are ``[range(0, 3), range(3, 5)]``.
    Raises ``ValueError`` when there are fewer layers than stages (a stage
    would hold none) or no stage.
    """
    if num_stages < 1:
        raise ValueError(f"a pipeline needs at least one stage; got {num_stages}")
    if num_layers < num_stages:
        raise ValueError(
            f"cannot split {num_layers} layer{'s' if num_layers != 1 else ''} over {num_stages} pipeline stages: "
            "every stage needs at least one layer (use fewer stages or virtual stages per rank)"
        )
    base, extra = divmod(num_layers, num_stages)
    found, start = [], 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        found.append(range(start, start + size))
        start += size
    return found


def schedule_class(name: str) -> type:
    """torch's schedule class called ``name`` (one of :data:`SCHEDULES`, any case); ``ValueError`` naming them."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    wanted = {known.lower(): known for known in SCHEDULES}
    if name.lower() not in wanted:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {', '.join(SCHEDULES)}")
    found: type = get_schedule_class(wanted[name.lower()])
    return found


def _canonical(name: str) -> str:
    return {known.lower(): known for known in SCHEDULES}[name.lower()]


def stage_indices(rank: int, pp_size: int, stages_per_rank: int, style: str = "loop") -> list[int]:
    """The stages ``rank`` holds of ``pp_size * stages_per_rank``: ``loop`` (rank r holds r, r + pp, ...) or ``v``
    (two stages per rank: r and ``2 * pp_size - 1 - r``). ``ValueError`` for another style or a V of more than
    two stages per rank."""
    if style == "loop":
        return [rank + pp_size * i for i in range(stages_per_rank)]
    if style == "v":
        if stages_per_rank != 2:
            raise ValueError(f"a V placement holds two stages per rank; got {stages_per_rank}")
        return [rank, 2 * pp_size - 1 - rank]
    raise ValueError(f"stage placement style must be 'loop' or 'v'; got {style!r}")


def _named_parts(model: nn.Module, names: Iterable[str]) -> list[tuple[str, nn.Module]]:
    return [(name, part) for name in names if isinstance(part := getattr(model, name, None), nn.Module)]


def refuse_tied_embeddings(model: nn.Module, first: Sequence[str] = FIRST_PARTS,
                           last: Sequence[str] = LAST_PARTS) -> None:
    """Raise ``ValueError`` where a parameter of the first stage's parts is also one of the last stage's (a head
    tied to the embedding): the two stages would hold two copies that drift apart. Every rank holds the same
    model, so every rank raises, before any communication."""
    owners: dict[int, str] = {}
    for part_name, part in _named_parts(model, first):
        for name, param in part.named_parameters(remove_duplicate=False):
            owners[id(param)] = f"{part_name}.{name}"
    for part_name, part in _named_parts(model, last):
        for name, param in part.named_parameters(remove_duplicate=False):
            if id(param) in owners:
                raise ValueError(
                    f"tied embeddings are not supported by pipeline parallelism: {part_name}.{name} is "
                    f"{owners[id(param)]}, and the first and last stages would each hold a copy that drift apart; "
                    "untie them (give the head a weight of its own) before building the pipeline"
                )


def stage_module(model: nn.Module, layers: range, *, first: bool, last: bool,
                 first_parts: Sequence[str] = FIRST_PARTS, last_parts: Sequence[str] = LAST_PARTS,
                 layers_attr: str = LAYERS) -> nn.Module:
    """A deep copy of ``model`` holding only ``layers`` of its ``layers_attr`` ModuleDict, its first parts if
    ``first`` and its last parts if ``last`` (the others set to None); parameter names are the model's."""
    blocks = getattr(model, layers_attr, None)
    if not isinstance(blocks, nn.ModuleDict):
        raise ValueError(
            f"the model's {layers_attr!r} must be an nn.ModuleDict keyed by layer index (got "
            f"{type(blocks).__name__}): a stage deletes the layers it does not hold and keeps the others' names"
        )
    dropped = [name for name, _ in _named_parts(model, () if first else first_parts)]
    dropped += [name for name, _ in _named_parts(model, () if last else last_parts)]
    stage = _copy_without(model, blocks, [name for position, name in enumerate(blocks) if position not in layers],
                          [name for name in dropped if name in model._modules])
    for name in dropped:
        setattr(stage, name, None)
    return stage


def _copy_without(model: nn.Module, blocks: nn.ModuleDict, layers: list[str], parts: list[str]) -> nn.Module:
    """A deep copy of ``model`` without the ``layers`` of ``blocks`` and with its submodules ``parts`` None: they
    are left out of the copy, not copied and then deleted (a stage copies its own share of the model). The
    model is unchanged afterwards; a module also reachable from what the stage keeps is copied there as before."""
    held, kept = blocks._modules, model._modules
    blocks._modules = {name: module for name, module in held.items() if name not in layers}
    model._modules = {name: None if name in parts else module for name, module in kept.items()}
    try:
        return copy.deepcopy(model)
    finally:
        blocks._modules, model._modules = held, kept


def shard_stage(module: nn.Module, dp_mesh: Any, layers_attr: str = LAYERS) -> nn.Module:
    """``module`` (a stage) sharded in place with FSDP2 over ``dp_mesh`` (1-D), as upstream shards a pipeline
    stage: each layer of its ``layers_attr`` a unit, then the stage's root (its other parts), none resharded after
    forward. Returns the module (now an ``FSDPModule``)."""
    from torch.distributed.fsdp import fully_shard

    if getattr(dp_mesh, "ndim", 1) != 1:
        raise ValueError(f"dp_mesh must be a 1-D mesh over the data-parallel ranks; got {dp_mesh.ndim} dims")
    blocks = getattr(module, layers_attr, None)
    for block in blocks.values() if isinstance(blocks, nn.ModuleDict) else ():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=False)
    return module


def build_pipeline(
    model: nn.Module,
    pp_mesh: Any,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    schedule: str = "1F1B",
    dp_mesh: Any = None,
    stages_per_rank: int | None = None,
    scale_grads: bool = False,
    first_parts: Sequence[str] = FIRST_PARTS,
    last_parts: Sequence[str] = LAST_PARTS,
    layers_attr: str = LAYERS,
) -> tuple[Any, list[Any]]:
    """``(schedule, stages)``: this rank's ``PipelineStage`` objects over ``pp_mesh`` (1-D) and the schedule
    ``schedule`` running ``n_microbatches`` microbatches through them with ``loss_fn`` on the last stage.

    ``stages_per_rank`` defaults to 1 for GPipe and 1F1B, 2 for the others
    (placed in a V for :data:`V_SCHEDULES`, round robin otherwise).
    ``scale_grads`` is False by upstream's contract (see the module
    docstring): ``loss_fn`` sums over label tokens and the caller divides the
    gradients afterwards with :func:`scale_grads_by_tokens`. ``dp_mesh``
    (1-D, the ``dp`` dim of a ``("pp", "dp")`` mesh whose ``pp`` dim is
    ``pp_mesh``): every stage is sharded over it with :func:`shard_stage`.
    The model is not changed; every rank must pass the same one (same seed).
    Raises ``ValueError``, on every rank alike, for tied embeddings, an
    unknown schedule, a mesh of more than one dim, fewer than one microbatch
    or fewer layers than stages.
    """
    from torch.distributed.pipelining import PipelineStage

    cls = schedule_class(schedule)
    name = _canonical(schedule)
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches must be at least 1; got {n_microbatches}")
    if getattr(pp_mesh, "ndim", 1) != 1:
        raise ValueError(f"pp_mesh must be a 1-D mesh over the pipeline ranks; got {pp_mesh.ndim} dims")
    if getattr(dp_mesh, "ndim", 1) != 1:
        raise ValueError(f"dp_mesh must be a 1-D mesh over the data-parallel ranks; got {dp_mesh.ndim} dims")
    per_rank = stages_per_rank or (1 if name in _SINGLE else 2)
    if name in _SINGLE and per_rank != 1:
        raise ValueError(f"schedule {name} runs one stage per rank; got stages_per_rank={per_rank}")
    refuse_tied_embeddings(model, first_parts, last_parts)
    pp_size, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    blocks = getattr(model, layers_attr, None)
    total = pp_size * per_rank
    splits = split_layers(len(blocks) if isinstance(blocks, nn.ModuleDict) else 0, total)
    device = next(model.parameters()).device
    stages = []
    for index in stage_indices(rank, pp_size, per_rank, "v" if name in V_SCHEDULES else "loop"):
        module = stage_module(model, splits[index], first=index == 0, last=index == total - 1,
                              first_parts=first_parts, last_parts=last_parts, layers_attr=layers_attr)
        if dp_mesh is not None:
            module = shard_stage(module, dp_mesh, layers_attr)
        stages.append(PipelineStage(module, index, total, device, group=pp_mesh.get_group()))
    made = cls(stages[0] if name in _SINGLE else stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    return made, stages


def token_sum_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = _IGNORE) -> torch.Tensor:
    """Cross entropy summed over a microbatch's label tokens (those not ``ignore_index``): upstream's loss."""
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum", ignore_index=ignore_index)


def count_label_tokens(labels: torch.Tensor, ignore_index: int = _IGNORE) -> int:
    """How many of ``labels`` are real label tokens (not ``ignore_index``): what the gradients are divided by."""
    return int((labels != ignore_index).sum().item())


def scale_grads_by_tokens(modules: Iterable[Any], num_label_tokens: int, dp_size: int = 1) -> None:
    """Divide every gradient of ``modules`` (modules, or ``PipelineStage`` objects: their ``submod``) by
    ``num_label_tokens / dp_size``, after the schedule's step: the token-summed loss becomes the token mean.
    ``ValueError`` for no label token (nothing to average over)."""
    if num_label_tokens <= 0:
        raise ValueError(f"the batch holds {num_label_tokens} label tokens: there is no token mean to scale to")
    divisor = num_label_tokens / dp_size
    for module in modules:
        for param in getattr(module, "submod", module).parameters():
            if param.grad is not None:
                param.grad.div_(divisor)
