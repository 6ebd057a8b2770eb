"""Rank side of the data-parallel check: the target's pipeline composed with data parallelism, against one process.

The world is a ``("pp", "dp")`` mesh of 2 pipeline ranks by ``world / 2``
data-parallel ones, upstream's layout (``pp`` outermost). Every rank builds
the same seeded model and keeps a copy for one process, hands the model to
the target with the mesh's ``pp`` dim and ``dp_mesh=`` its ``dp`` dim, and
reads which FSDP2 unit manages each parameter its stages hold. The batch has
``dp`` times the rows of a pipeline's microbatches; ``dp`` rank d feeds rows
``d * n .. (d + 1) * n`` through its pipeline, and one process takes them all.
Under ``token_sum`` the suite's step divides every gradient by the label
tokens of the whole batch over the ``dp`` size after the schedule's step, as
upstream's training loop does (``--pp-step``'s function gets ``dp_mesh=`` and
does its own). After the first step every held parameter's full gradient is
compared with one process's; where some differ, also with one process given
this rank's rows alone (what a ``dp`` rank whose gradients are never reduced
computes). After an SGD and an Adam step (two SGD steps below float64), every
held parameter. Cached per spec.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.adapters.target_raised import TargetRaised, run_once
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.pp import target
from nemo_dist.conformance.suites.pp.messages import DataParallelRun, Difference
from nemo_dist.conformance.suites.pp.placement import misplacement
from nemo_dist.conformance.suites.pp.ranks import (
    BUILDING,
    PLACING,
    SEED,
    batch,
    gradient_difference,
    held_parameters,
    optimizer,
    parameter_differences,
    parameter_label,
    within,
)

__all__ = ["PP", "fsdp2_units", "pp_dp_mesh", "run"]

#: The pipeline ranks of the composed mesh: the data-parallel ranks are the world over it.
PP = 2
_RUNS: dict[Any, DataParallelRun | TargetRaised] = {}
_MESHES: dict[Any, Any] = {}


def pp_dp_mesh() -> Any:
    """The ``("pp", "dp")`` CPU ``DeviceMesh`` of :data:`PP` by ``world / PP`` ranks, made once per world."""
    from torch.distributed.device_mesh import init_device_mesh

    size = dist.get_world_size()
    key = (size, id(dist.group.WORLD))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh("cpu", (PP, size // PP), mesh_dim_names=("pp", "dp"))
    return _MESHES[key]


def fsdp2_units(stages: list[Any]) -> dict[tuple[int, str], str]:
    """``(stage index, parameter name in the stage)`` -> the FSDP2 unit managing it: the innermost ``FSDPModule``
    of the stage's module holding it (``stage 0's root`` for the module itself, else its path); empty where
    no stage holds an FSDP2 unit."""
    from torch.distributed.fsdp import FSDPModule

    found: dict[tuple[int, str], str] = {}
    for stage in stages:
        index = int(stage.stage_index)
        units = [(path, module) for path, module in stage.submod.named_modules() if isinstance(module, FSDPModule)]
        for path, module in sorted(units, key=lambda unit: len(unit[0])):
            assert isinstance(module, torch.nn.Module)
            label = path or f"stage {index}'s root"
            prefix = f"{path}." if path else ""
            for name, _ in module.named_parameters():
                found[(index, prefix + name)] = label
    return found


def run(impl: Implementation, spec: dict[str, Any]) -> DataParallelRun:
    """Build and step as ``spec`` says (microbatches, schedule, steps); the report described above, cached."""
    return run_once(_RUNS, (impl, tuple(sorted((k, str(v)) for k, v in spec.items()))), lambda: _run(impl, spec))


def _run(impl: Implementation, spec: dict[str, Any]) -> DataParallelRun:
    microbatches, summed = int(spec["microbatches"]), target.token_sum(impl)
    model, vocab = target.build_model(impl, SEED)
    one = fresh_copy(model)
    alone = fresh_copy(model)
    reference = dict(one.named_parameters())
    mesh = pp_dp_mesh()
    dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    where = BUILDING
    try:
        made, stages = target.pipeline(impl, model, mesh["pp"], microbatches, spec.get("schedule"), mesh["dp"])
        held = held_parameters(stages, reference)
        units = fsdp2_units(stages)
        ids, labels = batch(microbatches * dp, summed, vocab)
        rows = ids.shape[0] // dp
        mine = slice(dp_rank * rows, (dp_rank + 1) * rows)
        tokens = int((labels != target.IGNORE).sum().item())
        report = DataParallelRun(
            pp=mesh["pp"].size(), dp=dp, dp_rank=dp_rank, stages=[int(s.stage_index) for s in stages],
            tolerance=target.tolerance(impl),
            units={parameter_label(i, n, k): units[(i, n)] for i, n, k, _ in held if (i, n) in units},
        )
        where = PLACING
        report.misplaced = misplacement(stages, mesh["pp"].get_group())
        if report.misplaced is not None:
            return report
        params = [param for *_, param in held]
        steps = [kind for kind, count in spec["steps"] for _ in range(count)]
        optimizers = {kind: (optimizer(kind, params), optimizer(kind, list(reference.values())))
                      for kind in set(steps)}
        for step, kind in enumerate(steps):
            where = f"in step {step + 1} (schedule.step on dp rank {dp_rank}'s rows)"
            one.zero_grad(set_to_none=True)
            target.train_step(impl, made, stages, ids[mine], labels[mine], [], divisor=tokens / dp,
                              dp_mesh=mesh["dp"])
            target.one_process_loss(one, ids, labels).backward()
            if step == 0:
                report.grads = {parameter_label(i, n, k): gradient_difference(p, reference.get(k or ""))
                                for i, n, k, p in held}
                if _anywhere(not all(within(pair, report.tolerance) for pair in report.grads.values())):
                    report.unreduced = _unreduced(alone, ids[mine], labels[mine], summed, tokens / dp, held)
            where = f"in optimizer step {step + 1} ({kind})"
            for each in optimizers[kind]:
                each.step()
        report.params = parameter_differences(held, reference)
        report.steps = steps
        return report
    except Exception as exc:  # the parent judges a raising target (checks.run_reports)
        raise TargetRaised(f"{where}: {type(exc).__name__}: {exc}") from exc


def _anywhere(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (one collective on every rank: all then take the same branch, whose
    full gradients are collectives over each ``dp`` group)."""
    found = torch.tensor([int(flag)])
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return bool(found.item())


def _unreduced(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, summed: bool, divisor: float,
               held: list[tuple[int, str, str | None, Any]]) -> dict[str, Difference | None]:
    """Each held gradient against one process given this rank's rows alone, scaled as this rank's step scales a
    gradient no ``dp`` reduction touched (under ``token_sum`` the sum over its label tokens over ``divisor``, else
    the mean over its rows)."""
    loss = target.one_process_loss(model, ids, labels, summed=summed)
    (loss / divisor if summed else loss).backward()
    variant = dict(model.named_parameters())
    return {parameter_label(i, n, k): gradient_difference(p, variant.get(k or "")) for i, n, k, p in held}
