"""Rank side of the pp suite: build the target's pipeline, step it next to one process, report.

Every rank builds the same seeded model (the suite's or ``--pp-model``'s, in
``--pp-compute-dtype``) and keeps a copy for one process. :func:`run` hands
the model to the target (:mod:`.target`), finds
which of the model's parameters each of this rank's stages holds (by name
where the values match, else by value: a split that renames is still read),
and runs the schedule's steps on the batch, the copy taking the whole batch
at once: after the first, the reported loss and every held gradient are
compared with one process's; after an SGD and an Adam step, every held
parameter. Under ``--pp-loss token_sum`` the suite divides the gradients by
the batch's label tokens after each step (upstream's training loop), and
the microbatches hold uneven label tokens; ``--pp-step`` replaces that step
(zeroing and scaling included) with the training loop's own. Results are cached per spec: the
checks share one run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.adapters.target_raised import TargetRaised, run_once
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.pp import target
from nemo_dist.conformance.suites.pp.messages import NormTwice, PipelineRun
from nemo_dist.conformance.suites.pp.models import TinyPipelineLM
from nemo_dist.conformance.suites.pp.placement import misplacement

__all__ = [
    "BUILDING",
    "PLACING",
    "SEED",
    "batch",
    "difference",
    "full",
    "gradient_difference",
    "held_parameters",
    "optimizer",
    "parameter_differences",
    "parameter_label",
    "pp_mesh",
    "run",
    "within",
]

SEED = 23
_SEQ = 6
_ROWS_PER_MICROBATCH = 2
#: Where a target that raised did so while building its pipeline (a refusal, when every rank raised there).
BUILDING = "building the pipeline"
#: Where a target that raised did so while its stages' placement was read (before any step).
PLACING = "reading where its stages are"
_RUNS: dict[Any, PipelineRun | TargetRaised] = {}
_MESHES: dict[Any, Any] = {}


def batch(microbatches: int, uneven: bool, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels below ``vocab``, 2 rows a microbatch; ``uneven``: microbatch m's last m label columns
    ignored."""
    generator = torch.Generator().manual_seed(SEED + microbatches)
    rows = _ROWS_PER_MICROBATCH * microbatches
    ids = torch.randint(0, vocab, (rows, _SEQ), generator=generator)
    labels = torch.randint(0, vocab, (rows, _SEQ), generator=generator)
    if uneven:
        for m in range(1, microbatches):
            labels[m * _ROWS_PER_MICROBATCH:(m + 1) * _ROWS_PER_MICROBATCH, _SEQ - min(m, _SEQ - 1):] = target.IGNORE
    return ids, labels


def within(pair: tuple[float, float, float, float] | None, tolerance: float) -> bool:
    """Whether a :func:`difference` is within ``tolerance`` of its scale (None, a missing gradient: no)."""
    return pair is not None and pair[0] <= tolerance * pair[1]


def difference(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, float, float]:
    """``(max |got - want|, max(1, max |want|), ratio, residual)``: ``ratio`` got's least-squares multiple of want,
    ``residual`` how far got is from that multiple (relative to its scale). Shapes that differ: inf."""
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    if got.shape != want.shape:
        return float("inf"), scale, float("nan"), float("inf")
    norm = (want * want).sum().item()
    ratio = (got * want).sum().item() / norm if norm else float("nan")
    residual = ((got - ratio * want).abs().max().item() / max(1.0, abs(ratio) * scale)) if norm else float("inf")
    return ((got - want).abs().max().item() if got.numel() else 0.0), scale, ratio, residual


def full(tensor: Any) -> torch.Tensor:
    """A tensor as one process holds it: a DTensor's full value (a collective over its mesh: every rank holding it
    calls this in the same order), anything else itself, detached."""
    found: torch.Tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return found.detach()


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha1(tensor.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def pp_mesh() -> Any:
    """The ``("pp",)`` CPU ``DeviceMesh`` over the whole world the target is given, made once per world."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (dist.get_world_size(), id(dist.group.WORLD))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("pp",))
    return _MESHES[key]


def held_parameters(
    stages: list[Any], reference: dict[str, torch.nn.Parameter]
) -> list[tuple[int, str, str | None, Any]]:
    """``(stage index, name in the stage, the model's name or None, parameter)`` of every parameter held (a
    sharded parameter read as its full value)."""
    by_value = {_digest(p): name for name, p in reference.items()}
    found = []
    for stage in stages:
        for name, param in stage.submod.named_parameters():
            value = full(param)
            same = name in reference and reference[name].shape == value.shape and torch.equal(
                reference[name].detach(), value)
            found.append((int(stage.stage_index), name, name if same else by_value.get(_digest(value)), param))
    return found


def optimizer(kind: str, params: list[Any]) -> torch.optim.Optimizer:
    """The suite's optimizer ``kind`` (``sgd``: lr 0.1; ``adam``: lr 0.01) over ``params``."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.Adam(params, lr=0.01, foreach=False)


def run(impl: Implementation, spec: dict[str, Any]) -> PipelineRun:
    """Build and step as ``spec`` says (microbatches, schedule, steps); the report described above, cached."""
    return run_once(_RUNS, (impl, tuple(sorted((k, str(v)) for k, v in spec.items()))), lambda: _run(impl, spec))


def _run(impl: Implementation, spec: dict[str, Any]) -> PipelineRun:
    microbatches, summed = int(spec["microbatches"]), target.token_sum(impl)
    model, vocab = target.build_model(impl, SEED, tied=bool(spec.get("tied")))
    one = fresh_copy(model)
    reference = dict(one.named_parameters())
    tied = _tied_names(one)
    where = BUILDING
    try:
        made, stages = target.pipeline(impl, model, pp_mesh(), microbatches, spec.get("schedule"))
        held = held_parameters(stages, reference)
        last = any(s.is_last for s in stages)
        ids, labels = batch(microbatches, summed, vocab)
        tokens = int((labels != target.IGNORE).sum().item())
        params = [param for *_, param in held]
        steps = [kind for kind, count in spec["steps"] for _ in range(count)]
        optimizers = {kind: (optimizer(kind, params), optimizer(kind, list(reference.values())))
                      for kind in set(steps)}
        report = PipelineRun(
            held=[(index, name, known) for index, name, known, _ in held], stages=[s.stage_index for s in stages],
            microbatches=microbatches, tokens=tokens, names=list(reference), tolerance=target.tolerance(impl),
            schedule=type(made).__name__,
        )
        where = PLACING
        report.misplaced = misplacement(stages)
        if report.misplaced is not None:
            return report
        first: dict[str, torch.Tensor] = {}
        for step, kind in enumerate(steps):
            where = f"in step {step + 1} (schedule.step)"
            for param in reference.values():
                param.grad = None
            losses: list[torch.Tensor] = []
            target.train_step(impl, made, stages, ids, labels, losses)
            want = target.one_process_loss(one, ids, labels)
            want.backward()
            if step == 1:
                report.carried = _carried(held, reference, first)
            if step == 0:
                first = {k: _grad_of(reference[k]).clone() for _, _, k, _ in held if k}
                if last and losses:
                    got = torch.stack([loss.detach() for loss in losses]).sum().item()
                    report.loss = (got / tokens if summed else got / len(losses), want.item())
                report.grads = {parameter_label(i, n, k, tied): gradient_difference(p, reference.get(k or ""))
                                for i, n, k, p in held}
                report.copies = [(i, k, None if p.grad is None else p.grad.detach().tolist())
                                 for i, _, k, p in held if k in tied]
                report.want_copies = {k: _grad_of(reference[k]).tolist() for k in tied}
                if isinstance(one, TinyPipelineLM) and one.norm is not None and _first_step_off(report):
                    report.norm_twice = _norm_twice(one, ids, labels, held, report)
            where = f"in optimizer step {step + 1} ({kind})"
            for each in optimizers[kind]:
                each.step()
        report.params = parameter_differences(held, reference, tied)
        report.steps = steps
        return report
    except Exception as exc:  # the parent judges a raising target (checks.run_reports)
        raise TargetRaised(f"{where}: {type(exc).__name__}: {exc}") from exc


def _first_step_off(report: PipelineRun) -> bool:
    """Whether this rank's first-step loss or some gradient it holds differs from one process's (only then is a
    known bug worth re-running)."""
    tolerance, loss = report.tolerance, report.loss
    return (loss is not None and abs(loss[0] - loss[1]) > tolerance * max(1.0, abs(loss[1]))) or any(
        pair is None or pair[0] > tolerance * pair[1] for pair in report.grads.values())


def _norm_twice(one: TinyPipelineLM, ids: torch.Tensor, labels: torch.Tensor,
                held: list[tuple[int, str, str | None, Any]], report: PipelineRun) -> NormTwice:
    """One process (a copy of ``one``, before its first optimizer step) with its final norm applied twice, against
    this rank's first step: ``loss`` (the variant's, where this rank reports one) and ``grads`` (each held
    parameter's gradient against the variant's, as :func:`difference`). Run only where the first step is off."""
    model = fresh_copy(one)
    model.zero_grad(set_to_none=True)
    norm: Any = model.norm
    once = norm.forward
    norm.forward = lambda x: once(once(x))
    loss = target.one_process_loss(model, ids, labels)
    loss.backward()
    variant = dict(model.named_parameters())
    grads = {parameter_label(i, n, k): difference(_grad_of(p), _grad_of(variant[k])) for i, n, k, p in held
             if k and k in variant}
    return NormTwice(loss=loss.item() if report.loss is not None else None, grads=grads)


def _carried(
    held: list[tuple[int, str, str | None, Any]], reference: dict[str, Any], first: dict[str, torch.Tensor]
) -> tuple[float, float] | None:
    """In the second step, ``(c, residual)``: the one c with every held gradient equal to one process's gradient
    of this step plus c times its first step's (least squares over every held parameter), and the largest
    difference left, relative to max(1, max |gradient|); None where the first step's gradients are all zero."""
    pairs = [(_grad_of(p).double(), _grad_of(reference[k]).double(), first[k].double())
             for _, _, k, p in held if k and k in first]
    norm = sum(float((g1 * g1).sum()) for _, _, g1 in pairs)
    if not pairs or not norm:
        return None
    c = sum(float(((got - g2) * g1).sum()) for got, g2, g1 in pairs) / norm
    residual = max(float((got - g2 - c * g1).abs().max()) / max(1.0, float(got.abs().max())) if got.numel() else 0.0
                   for got, g2, g1 in pairs)
    return c, residual


def parameter_differences(held: list[tuple[int, str, str | None, Any]], reference: dict[str, Any],
                          tied: frozenset[str] = frozenset()) -> dict[str, tuple[float, float, float, float] | None]:
    """Each held parameter (its full value) against one process's, by :func:`parameter_label`: :func:`difference`,
    None where it is not a parameter of the model."""
    return {parameter_label(i, n, k, tied): difference(full(p), reference[k].detach()) if k else None
            for i, n, k, p in held}


def parameter_label(index: int, name: str, known: str | None, tied: frozenset[str] = frozenset()) -> str:
    """A held parameter's name in reports: the model's name (with its stage where the model ties it: each stage
    may hold a copy), else the stage's own name marked unknown."""
    if known is None:
        return f"stage {index}: {name} (not a parameter of the model)"
    return f"{known} (stage {index}'s copy)" if known in tied else known


def _grad_of(param: Any) -> torch.Tensor:
    """A parameter's gradient, zeros where it has none."""
    return param.grad.detach() if param.grad is not None else torch.zeros_like(param.detach())


def _tied_names(model: torch.nn.Module) -> frozenset[str]:
    """The names (as ``named_parameters()`` gives them once) of the parameters the model holds under two names."""
    seen: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(param), []).append(name)
    return frozenset(names[0] for names in seen.values() if len(names) > 1)


def gradient_difference(param: Any, reference: Any) -> tuple[float, float, float, float] | None:
    """:func:`difference` of the gradients; None where the parameter got none and one process's is nonzero."""
    if reference is None:
        return None
    want = reference.grad if reference.grad is not None else torch.zeros_like(reference)
    if param.grad is None:
        return None if bool(want.any()) else (0.0, 1.0, 1.0, 0.0)
    return difference(full(param.grad), want.detach())
