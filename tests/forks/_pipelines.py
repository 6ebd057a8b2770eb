"""The frame of the pipeline gallery (``gallery_pp_*``): a torchtitan-style manual split its rows share.

:func:`manual` splits the suite's model the way torchtitan's
``pipeline_module_split`` does: each stage a deep copy of the whole model
with the layers it does not hold deleted and the parts it does not hold set
to None, one stage per rank, a single-stage torch schedule. Its flags break
it the ways the public bug classes do: the loss's scaling, the split's
arithmetic, a layer at a boundary held twice, a stage's output detached, the
final norm applied twice, keyword inputs dropped by the stages after the first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

__all__ = ["Detached", "HiddenStatesOnly", "manual"]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Detached(nn.Module):
    """A stage module whose output leaves the graph (``.detach()``): earlier stages then get no gradient."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The inner stage's output, detached."""
        return self.inner(x).detach()


class HiddenStatesOnly(nn.Module):
    """A later stage's module written for hidden states alone: ``forward(hidden_states, **kwargs)`` runs the stage
    on them and drops the keyword inputs its step hands it (they were meant for the first stage's embedding), so
    its layers run with their default positions."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states: torch.Tensor, **_kwargs: object) -> torch.Tensor:
        """The inner stage on the hidden states alone."""
        out: torch.Tensor = self.inner(hidden_states)
        return out


def _even_split(layers: int, stages: int) -> list[list[int]]:
    """torchtitan's split: ``ceil(layers / stages)`` a stage, the last stage the rest."""
    size = -(-layers // stages)
    return [list(range(i * size, min(layers, (i + 1) * size))) for i in range(stages)]


def _floor_split(layers: int, stages: int) -> list[list[int]]:
    """``layers // stages`` a stage: the remainder never placed (mlx-lm #1688's class)."""
    size = layers // stages
    return [list(range(i * size, (i + 1) * size)) for i in range(stages)]


def _fully_shard(stage: nn.Module, dp_mesh: Any) -> None:
    """torchtitan's FSDP2 of a pipeline stage: each block, the embedding, the final norm and head together, then
    the stage, none resharded after forward (the microbatches share one all-gather)."""
    from torch.distributed.fsdp import fully_shard

    for block in stage.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
    if stage.tok_embeddings is not None:
        fully_shard(stage.tok_embeddings, mesh=dp_mesh, reshard_after_forward=False)
    if stage.output is not None:
        fully_shard([stage.norm, stage.output], mesh=dp_mesh, reshard_after_forward=False)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=False)


def manual(model: nn.Module, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, *, schedule: str = "1F1B",
           scale_grads: bool = True, floor_split: bool = False, detach: bool = False, overlap: bool = False,
           norm_twice: bool = False, keywords_first_only: bool = False, dp_mesh: Any = None) -> tuple[Any, list[Any]]:
    """One stage per rank of ``model`` (tok_embeddings, layers, norm, output), as the module docstring says.

    ``overlap``: every stage after the first also holds (and runs) the layer before its own; ``norm_twice``:
    the last stage applies the final norm twice; ``keywords_first_only``: every stage after the first drops the
    keyword inputs it is handed (:class:`HiddenStatesOnly`); ``dp_mesh``: the stage sharded over it with FSDP2 as
    torchtitan shards one."""
    rank, size = pp_mesh.get_local_rank(), pp_mesh.size()
    split = (_floor_split if floor_split else _even_split)(len(model.layers), size)[rank]
    if overlap and rank > 0:
        split = [split[0] - 1, *split]
    stage = copy.deepcopy(model)
    for name in list(stage.layers.keys()):
        if int(name) not in split:
            del stage.layers[name]
    if rank != 0:
        stage.tok_embeddings = None
    if rank != size - 1:
        stage.norm = None
        stage.output = None
    elif norm_twice:
        stage.norm = nn.Sequential(stage.norm, stage.norm)
    if dp_mesh is not None:
        _fully_shard(stage, dp_mesh)
    module: nn.Module = Detached(stage) if detach and rank != size - 1 else stage
    if keywords_first_only and rank > 0:
        module = HiddenStatesOnly(module)
    built = PipelineStage(module, rank, size, torch.device("cpu"), group=pp_mesh.get_group())
    cls = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
    return cls(built, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads), [built]
