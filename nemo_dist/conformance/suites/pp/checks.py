"""Conformance checks of pipelines: any stage split and schedule judged by behaviour against one process.

Each check runs the target's pipeline (:mod:`.target`) on a pipeline group
of the whole world, for every schedule ``--pp-schedule`` names (or the
function's own) and every microbatch count of the run's matrix: 1, 2 and 4
in the run's smallest world of two ranks or more, the world's size in the
others, one schedule each (:func:`matrix`). The checks of one
run share it (:func:`each_run`). A pipeline that refuses a microbatch count
below twice the world's size on every rank alike while it is built, its
error naming microbatches (1F1B refuses fewer microbatches than stages), is
skipped for that count, not failed; any other error fails.

Tolerances, relative to ``max(1, max |expected|)``: 1e-12 for the loss and
gradients (float64 throughout; the largest difference measured with 2 to 4
microbatches is 9e-16, the smallest real bug about 1e-3), 1e-10 for the
parameters after an SGD and an Adam step (Adam divides by ``sqrt(v) +
1e-8``, which can magnify a roundoff on a gradient below 1e-8 a
millionfold).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_dist.conformance.adapters.target_raised import Raised, split_reports
from nemo_dist.conformance.adapters.target_raised import run_reports as rank_reports
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, failure, thorough
from nemo_dist.conformance.suites.pp import ranks, target
from nemo_dist.conformance.suites.pp.causes import (
    DETACHED,
    DROPPED,
    DUPLICATED,
    NEVER_ZEROED,
    NORM_TWICE,
    TIED_NOT_SUMMED,
    cause_of,
    exact_factor,
    pp_check,
)
from nemo_dist.conformance.suites.pp.messages import Difference, PipelineRun
from nemo_dist.conformance.suites.pp.placement import fail_if_misplaced

__all__ = [
    "GRADIENT_TOLERANCE",
    "PARAMETER_TOLERANCE",
    "describe",
    "differing",
    "each_run",
    "gradients_equal_one_process",
    "in_turn",
    "judge_gradients",
    "judge_held",
    "judge_loss",
    "judge_training",
    "loss_equals_one_process",
    "matrix",
    "raised_message",
    "refused_alike",
    "stage_list",
    "stages_hold_every_parameter_once",
    "steps_of",
    "tied_weights_summed_or_refused",
    "trains_like_one_process",
]

#: The loss's and gradients' tolerance in float64 (below it, :func:`~.target.tolerance`'s).
GRADIENT_TOLERANCE = target.FLOAT64_TOLERANCE
#: The parameters' tolerance after the steps in float64 (below it, the gradients' tolerance).
PARAMETER_TOLERANCE = 1e-10
#: The optimizer steps of every run: one SGD step, then one Adam step (the first step's gradients are checked).
STEPS = (("sgd", 1), ("adam", 1))
#: The microbatch counts of the whole matrix.
MICROBATCHES = (1, 2, 4)
#: The steps below float64: two SGD steps (Adam would magnify the dtype's roundoff on a small gradient).
LOW_PRECISION_STEPS = (("sgd", 2),)

def steps_of(impl: Implementation) -> tuple[tuple[str, int], ...]:
    """The optimizer steps a run takes: :data:`STEPS` in float64, else :data:`LOW_PRECISION_STEPS`."""
    return STEPS if target.dtype(impl) == torch.float64 else LOW_PRECISION_STEPS


def describe(schedule: str | None, size: int, microbatches: int) -> str:
    return (f"{schedule or 'its own schedule'}, pp {size}, {microbatches} microbatch"
            f"{'es' if microbatches != 1 else ''}")


def run_reports(world: WorldLike, impl: Implementation, spec: dict[str, Any]) -> list[PipelineRun | Raised]:
    """Every rank's :func:`~.ranks.run` of ``spec``; a rank where the target raised reports
    :class:`~nemo_dist.conformance.adapters.target_raised.Raised` instead (a raise on some ranks only is the
    harness's ``RankFailure``, never a hang)."""
    return rank_reports(world, ranks.run, impl, spec)



def matrix(size: int, impl: Implementation) -> list[tuple[str | None, int]]:
    """``(schedule, microbatches)`` pairs a world of ``size`` runs: every schedule with 1, 2 and 4 microbatches
    where the check is thorough, else one schedule (the schedules taken in turn by world size) with ``size``."""
    schedules = target.schedules(impl)
    if thorough():
        return [(schedule, m) for schedule in schedules for m in MICROBATCHES]
    return [(schedules[(size - 2) % len(schedules)], size)]


def each_run(world: WorldLike, impl: Implementation) -> list[tuple[str, list[PipelineRun]]]:
    """``(label, reports)`` of every schedule and microbatch count this world runs (see the module docstring);
    a target that raised is a failure naming its error and ranks; NotApplicable when every count is refused."""
    runs, refused = [], []
    for schedule, microbatches in matrix(world.size, impl):
        where = describe(schedule, world.size, microbatches)
        spec = {"microbatches": microbatches, "schedule": schedule, "steps": steps_of(impl)}
        raised, found = split_reports(run_reports(world, impl, spec))
        if not raised:
            fail_if_misplaced(where, found)
            runs.append((where, found))
            continue
        first = raised[0][1]
        alike = refused_alike(raised, world.size)
        if alike is not None and microbatches < 2 * world.size and _about_microbatches(alike):
            refused.append(f"{where}: {first.error}")
            continue
        raise AssertionError(raised_message(where, raised, world.size))
    if not runs:
        raise NotApplicable("the pipeline refuses every microbatch count checked: " + "; ".join(refused))
    return runs


def in_turn(world: WorldLike, impl: Implementation, run: Callable[..., Any], suffix: str) -> tuple[str, list[Any]]:
    """``(label, reports)`` of ``run`` (a rank side taking ``(impl, spec)``) on one schedule a world (taken in turn
    by world size) with as many microbatches as ranks, twice as many where every rank refuses that count naming
    microbatches; ``suffix`` ends the label. NotApplicable where every rank refuses to build the pipeline (the core
    checks judge that); a failure naming the ranks where some raised, or where the stages are misplaced."""
    schedules = target.schedules(impl)
    schedule = schedules[(world.size - 2) % len(schedules)]
    for microbatches in (world.size, 2 * world.size):
        where = describe(schedule, world.size, microbatches) + suffix
        raised, found = split_reports(rank_reports(world, run, impl, {"microbatches": microbatches,
                                                                       "schedule": schedule}))
        alike = refused_alike(raised, world.size)
        if alike is None or not _about_microbatches(alike):
            break
    if alike is not None:
        raise NotApplicable(f"{where}: the pipeline refuses to be built on every rank ({alike.error}); the core "
                            "checks judge that")
    if raised:
        raise AssertionError(raised_message(where, raised, world.size))
    fail_if_misplaced(where, found)
    return where, found


def raised_message(where: str, raised: list[tuple[int, Raised]], size: int) -> str:
    """A failure's message for a pipeline that raised on some of ``size`` ranks: which ranks, where and what (once
    where they raised alike), then the first one's traceback."""
    first = raised[0][1]
    if len({(r.where, r.error) for _, r in raised}) == 1:
        ranks_text = "every rank" if len(raised) == size else "rank" + (
            "s " if len(raised) > 1 else " ") + ", ".join(str(rank) for rank, _ in raised)
        errors = f"{ranks_text} {first.where}: {first.error}"
    else:
        errors = "; ".join(f"rank {rank} {r.where}: {r.error}" for rank, r in raised)
    return f"{where}: the pipeline raised on {len(raised)} of {size} ranks: {errors}\n{first.traceback}"


def stage_list(indices: list[int]) -> str:
    """``stage 1`` or ``stages 0, 2``."""
    return ("stage " if len(indices) == 1 else "stages ") + ", ".join(map(str, indices))


def differing(head: str, off: Mapping[str, Difference | None], total: int) -> list[str]:
    """The lines, each starting ``head``, naming gradients that differ from one process's (``off``, of ``total``):
    those that got none, then how many differ and the largest, relative to its scale."""
    lines = []
    missing = [label for label, pair in off.items() if pair is None]
    shown = {label: pair for label, pair in off.items() if pair is not None}
    if missing:
        lines.append(head + f"no gradient for {', '.join(missing)}")
    if shown:
        label, pair = max(shown.items(), key=lambda item: item[1][0] / item[1][1])
        lines.append(head + f"{len(shown)} of {total} gradients differ, the largest by {pair[0]:.3g} ({label}, "
                            f"{pair[2]:.6g} times one process's)")
    return lines


def refused_alike(raised: list[tuple[int, Raised]], size: int) -> Raised | None:
    """What every one of ``size`` ranks raised alike while building the pipeline (one error on every rank), else
    None."""
    first = raised[0][1] if raised else None
    if first is not None and len(raised) == size and {(r.where, r.error) for _, r in raised} == {
        (ranks.BUILDING, first.error)
    }:
        return first
    return None


def _about_microbatches(report: Raised) -> bool:
    """Whether a target's error refuses a microbatch count (torch's say "microbatches"): any other error is a
    failure, whatever the count."""
    return "microbatch" in report.error.lower()


def _sizes(report: PipelineRun) -> dict[str, float]:
    m, tokens = report.microbatches, report.tokens
    return {"M": m, "1/M": 1 / m, "tokens": tokens, "tokens/M": tokens / m}


@pp_check("pp.stages_hold_every_parameter_once")
def stages_hold_every_parameter_once(world: WorldLike, impl: Implementation) -> None:
    """The stages of all ranks together hold every parameter of the model exactly once, and nothing else."""
    for where, found in each_run(world, impl):
        judge_held(where, found)


def judge_held(where: str, found: list[PipelineRun]) -> None:
    """Fail where the ranks' stages together miss a parameter of the model, hold one twice or hold another."""
    held: dict[str | None, list[str]] = {}
    for rank, report in enumerate(found):
        for index, name, known in report.held:
            held.setdefault(known, []).append(f"stage {index} (rank {rank}) as {name}")
    unknown = held.pop(None, [])
    assert not unknown, f"{where}: stages hold parameters that are not the model's: {', '.join(unknown)}"
    missing = [name for name in found[0].names if name not in held]
    if missing:
        raise failure(f"{where}: no stage holds {', '.join(missing)}", DROPPED.format(layers=_layers(missing)))
    twice = {str(name): places for name, places in held.items() if len(places) > 1}
    if twice:
        lines = "\n".join(f"  {name}: {'; '.join(places)}" for name, places in twice.items())
        raise failure(f"{where}: parameters held more than once:\n{lines}",
                      DUPLICATED.format(layers=_layers(list(twice))))


def _layers(names: list[str]) -> str:
    """The layers (``layers.3``) or parts the parameter names belong to, in order."""
    parts = [".".join(name.split(".")[:2]) if name.startswith("layers.") else name.split(".")[0] for name in names]
    return ", ".join(dict.fromkeys(parts))


@pp_check("pp.loss_equals_one_process")
def loss_equals_one_process(world: WorldLike, impl: Implementation) -> None:
    """The loss the last stage reports (microbatch means averaged, or token sums over the label tokens) equals one
    process's mean over the whole batch."""
    for where, found in each_run(world, impl):
        judge_loss(where, found)


def judge_loss(where: str, found: list[PipelineRun]) -> None:
    """Fail where the loss a rank's last stage reports differs from one process's (or no rank reports one)."""
    reported = [(rank, r, r.loss) for rank, r in enumerate(found) if r.loss is not None]
    assert reported, f"{where}: no rank reports a loss (the last stage's schedule.step filled no losses list)"
    for rank, report, (got, want) in reported:
        if abs(got - want) <= report.tolerance * max(1.0, abs(want)):
            continue
        message = f"{where}, rank {rank}: the loss is {got!r}, one process's {want!r}"
        variant = report.norm_twice.loss if report.norm_twice is not None else None
        if variant is not None and abs(got - variant) <= report.tolerance * max(1.0, abs(variant)):
            raise failure(message, NORM_TWICE.format(what="the loss is"))
        ratio = got / want if want else float("nan")
        factor = exact_factor([(ratio, 0.0)], _sizes(report), report.tolerance)
        raise failure(message, cause_of(factor, "the loss is", _sizes(report))) if factor else AssertionError(
            message)


@pp_check("pp.gradients_equal_one_process")
def gradients_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Every parameter's gradient on the stage holding it equals one process's after a step of the schedule (under
    ``token_sum``, divided by the batch's label tokens)."""
    for where, found in each_run(world, impl):
        judge_gradients(where, found)


def judge_gradients(where: str, found: list[PipelineRun]) -> None:
    """Fail where some rank's first-step gradients differ from one process's (or some are missing)."""
    for rank, report in enumerate(found):
        grads = report.grads
        missing = [name for name, pair in grads.items() if pair is None]
        if missing:
            stages = sorted({i for i, _, known in report.held if known in missing})
            whole = [i for i in stages
                     if all(k is None or grads.get(k) is None for j, _, k in report.held if j == i)]
            message = f"{where}, rank {rank}: no gradient for {', '.join(missing)}"
            if whole and whole == stages:
                raise failure(message, DETACHED.format(stages=", ".join(map(str, whole))))
            raise AssertionError(message)
        wrong = {name: pair for name, pair in grads.items()
                 if pair is not None and not ranks.within(pair, report.tolerance)}
        if not wrong:
            continue
        lines = "\n".join(f"  {name}: off by {pair[0]:.3g} ({pair[2]:.6g} times one process's)"
                          for name, pair in wrong.items())
        message = f"{where}, rank {rank}: gradients differ from one process's:\n{lines}"
        if _norm_twice_explains(found):
            raise failure(message, NORM_TWICE.format(what="every gradient is"))
        factor = exact_factor([(pair[2], pair[3]) for pair in wrong.values()], _sizes(report), report.tolerance)
        if factor:
            raise failure(message, cause_of(factor, "gradients", _sizes(report)))
        raise AssertionError(message)


@pp_check("pp.trains_like_one_process")
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """After an SGD and an Adam step through the schedule (two SGD steps below float64), every parameter equals one
    process's."""
    for where, found in each_run(world, impl):
        judge_training(where, found)


def judge_training(where: str, found: list[PipelineRun]) -> None:
    """Fail where some rank's parameters after the steps differ from one process's."""
    for rank, report in enumerate(found):
        allowed = max(PARAMETER_TOLERANCE, report.tolerance)
        wrong = [f"  {name}: off by {pair[0]:.3g}" for name, pair in report.params.items()
                 if pair is not None and not ranks.within(pair, allowed)]
        if not wrong:
            continue
        message = (f"{where}, rank {rank}: after {' and '.join(report.steps)} steps the parameters differ from "
                   "one process's:\n" + "\n".join(wrong))
        if _norm_twice_explains(found):
            raise failure(message, NORM_TWICE.format(what="every gradient of the first step is"))
        carried = [f.carried for f in found if f.carried is not None]
        if len(carried) == len(found) and all(abs(c) > 1e-9 and left <= report.tolerance for c, left in carried):
            raise failure(message, NEVER_ZEROED.format(c=carried[0][0]))
        raise AssertionError(message)


def _norm_twice_explains(found: list[PipelineRun]) -> bool:
    """Whether every rank's gradients equal one process's with the final norm applied twice (the suite's model)."""
    variants = [f.norm_twice for f in found if f.norm_twice is not None]
    return len(variants) == len(found) and all(v.grads for v in variants) and all(
        ranks.within(pair, f.tolerance) for f, v in zip(found, variants, strict=True) for pair in v.grads.values())


def _float64(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@pp_check("pp.tied_weights_summed_or_refused", tier="extended")
def tied_weights_summed_or_refused(world: WorldLike, impl: Implementation) -> None:
    """A model whose head is tied to its embedding is refused on every rank while the pipeline is built, or each
    stage's copy gets the sum of both uses' gradients and the copies train as one process's one weight."""
    if impl.suite_option("pp_model") is not None:
        raise NotApplicable("checked on the suite's own model, tied; --pp-model names another")
    schedule = target.schedules(impl)[0]
    where = describe(schedule, world.size, world.size) + ", the head tied to the embedding"
    spec = {"microbatches": world.size, "schedule": schedule, "steps": steps_of(impl), "tied": True}
    raised, found = split_reports(run_reports(world, impl, spec))
    if raised:
        if len(raised) == world.size and all(r.where == ranks.BUILDING for _, r in raised):
            return  # refused on every rank before any step: what a pipeline that cannot keep copies in sync does
        errors = "; ".join(f"rank {rank} {r.where}: {r.error}" for rank, r in raised)
        raise AssertionError(f"{where}: the pipeline raised on {len(raised)} of {world.size} ranks: {errors}")
    fail_if_misplaced(where, found)
    tolerance = found[0].tolerance
    copies = [(rank, index, name, grad) for rank, r in enumerate(found) for index, name, grad in r.copies]
    for name, want_list in found[0].want_copies.items():
        want = _float64(want_list)
        mine = [(rank, index, grad) for rank, index, known, grad in copies if known == name]
        scale = max(1.0, want.abs().max().item())
        off = {(rank, index): float("inf") if grad is None else (_float64(grad) - want).abs().max().item()
               for rank, index, grad in mine}
        wrong = {key: d for key, d in off.items() if d > tolerance * scale}
        if not wrong:
            continue
        lines = ", ".join(f"stage {index} (rank {rank}) off by {d:.3g}" for (rank, index), d in wrong.items())
        message = f"{where}: the gradient of {name}'s copies differs from one process's: {lines}"
        total = sum((_float64(grad) for _, _, grad in mine if grad is not None), torch.zeros_like(want))
        if len(mine) > 1 and (total - want).abs().max().item() <= tolerance * scale:
            stages = ", ".join(dict.fromkeys(str(i) for _, i, _ in mine))
            raise failure(message, TIED_NOT_SUMMED.format(name=name, stages=stages))
        raise AssertionError(message)
    for rank, report in enumerate(found):
        allowed = max(PARAMETER_TOLERANCE, tolerance)
        drifted = [f"{label} off by {pair[0]:.3g}" for label, pair in report.params.items()
                   if "copy" in label and pair is not None and not ranks.within(pair, allowed)]
        assert not drifted, f"{where}, rank {rank}: after the steps the tied copies differ from one process's: " + (
            ", ".join(drifted))
