"""The data-parallel check: the pipeline composed with data parallelism (FSDP2, as upstream composes them) trains
like one process.

Upstream runs pipeline parallelism on a ``("pp", "dp")`` mesh: each stage
sharded with FSDP2 over its ``dp`` group, each ``dp`` rank feeding its own
rows, the schedule's last backward ending in FSDP2's reduce-scatter (an
average over ``dp``), and the training loop dividing every gradient by the
batch's label tokens over the ``dp`` size. The suite gives the target
``dp_mesh=`` beside the ``pp`` mesh and compares with one process given
every ``dp`` rank's rows (:mod:`.data_parallel`).
"""

from __future__ import annotations

from nemo_dist.conformance.adapters.target_raised import run_reports, split_reports
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.engine.registry import WorldLike, WorldRule, failure
from nemo_dist.conformance.suites.pp import data_parallel, target
from nemo_dist.conformance.suites.pp.causes import DP_FACTORS, DP_UNITS, NEVER_REDUCED, exact_factor, pp_check
from nemo_dist.conformance.suites.pp.checks import (
    PARAMETER_TOLERANCE,
    differing,
    raised_message,
    refused_alike,
    stage_list,
    steps_of,
)
from nemo_dist.conformance.suites.pp.messages import DataParallelRun, Difference
from nemo_dist.conformance.suites.pp.placement import fail_if_misplaced
from nemo_dist.conformance.suites.pp.ranks import within

__all__ = ["PP_BY_DP", "data_parallel_trains_like_one_process", "likely_cause"]

#: The worlds the check runs in: 2 pipeline ranks by 2 or more data-parallel ones.
PP_BY_DP = WorldRule(
    fits=lambda size: size >= 2 * data_parallel.PP and size % data_parallel.PP == 0,
    reason="a world of {size} is not 2 pipeline ranks by 2 or more data-parallel ranks",
)


@pp_check("pp.data_parallel_trains_like_one_process", tier="extended", rule=PP_BY_DP)
def data_parallel_trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """Composed with data parallelism on a ``("pp", "dp")`` mesh of 2 pipeline ranks by ``world / 2``, each ``dp``
    rank feeding its own rows, every gradient after a step equals one process's given all the rows, and every
    parameter after an SGD and an Adam step (two SGD steps below float64). One schedule (the first named), 4
    microbatches a pipeline (so that the microbatch count and the ``dp`` size differ), once, in the smallest
    world that fits.

    Extended: it checks a composition beyond the core contract. NOT APPLICABLE where the pipeline function takes
    no keyword ``dp_mesh``, where ``--pp-step``'s function names no parameter ``dp_mesh`` (its division by the
    label tokens must count every ``dp`` rank's), or where every rank refuses alike to build the composed
    pipeline (its error shown). A likely cause is named only where the numbers prove it: every gradient exactly
    the ``dp`` size (or its inverse) times one process's; exactly the parameters of some FSDP2 units that factor
    off and every other unit's right; every rank's gradients one process's given that rank's rows alone (never
    reduced).
    """
    if not target.takes_keyword(resolve_callable(impl.suite_option("pp_fn")), "dp_mesh"):
        raise NotApplicable("the pipeline function takes no keyword dp_mesh: it composes with no data parallelism")
    step = impl.suite_option("pp_step")
    if step is not None and not target.takes_keyword(resolve_callable(step), "dp_mesh", named=True):
        raise NotApplicable("the --pp-step function names no parameter dp_mesh: composed with data parallelism its "
                            "division by the label tokens must count every dp rank's")
    schedule = target.schedules(impl)[0]
    microbatches = 2 * data_parallel.PP
    dp = world.size // data_parallel.PP
    where = (f"{schedule or 'its own schedule'}, pp {data_parallel.PP} x dp {dp}, {microbatches} microbatches a "
             "pipeline")
    spec = {"microbatches": microbatches, "schedule": schedule, "steps": steps_of(impl)}
    raised, found = split_reports(run_reports(world, data_parallel.run, impl, spec))
    if (alike := refused_alike(raised, world.size)) is not None:
        raise NotApplicable(f"{where}: every rank refuses to build the composed pipeline: {alike.error}")
    if raised:
        raise AssertionError(raised_message(where, raised, world.size))
    fail_if_misplaced(where, found)
    _judge_gradients(where, found)
    for rank, report in enumerate(found):
        allowed = max(PARAMETER_TOLERANCE, report.tolerance)
        wrong = [f"  {name}: off by {pair[0]:.3g}" for name, pair in report.params.items()
                 if pair is not None and not within(pair, allowed)]
        if wrong:
            raise AssertionError(f"{where}, rank {rank} ({stage_list(report.stages)}, dp rank {report.dp_rank}): "
                                 f"after {' and '.join(report.steps)} steps the parameters differ from one "
                                 "process's:\n" + "\n".join(wrong))


def _judge_gradients(where: str, found: list[DataParallelRun]) -> None:
    """Fail where some rank's first-step gradients differ from one process's, naming a cause the numbers prove."""
    wrong: dict[int, dict[str, Difference | None]] = {
        rank: {label: pair for label, pair in report.grads.items() if not within(pair, report.tolerance)}
        for rank, report in enumerate(found)}
    if not any(wrong.values()):
        return
    lines = []
    for rank, pairs in wrong.items():
        if not pairs:
            continue
        report = found[rank]
        lines += differing(f"  rank {rank} ({stage_list(report.stages)}, dp rank {report.dp_rank}): ", pairs,
                           len(report.grads))
    message = f"{where}: gradients differ from one process's given every dp rank's rows:\n" + "\n".join(lines)
    cause = likely_cause(found, wrong)
    raise failure(message, cause) if cause else AssertionError(message)


def likely_cause(found: list[DataParallelRun], wrong: dict[int, dict[str, Difference | None]]) -> str | None:
    """The likely cause the numbers prove (see the check's docstring), else None."""
    dp = found[0].dp
    sizes = {"dp": float(dp), "1/dp": 1.0 / dp}
    off = [pair for pairs in wrong.values() for pair in pairs.values()]
    tolerance = max(report.tolerance for report in found)
    factor = None if any(pair is None for pair in off) else exact_factor(
        [(pair[2], pair[3]) for pair in off if pair is not None], sizes, tolerance)
    if factor is not None and all(len(wrong[rank]) == len(report.grads) for rank, report in enumerate(found)):
        return DP_FACTORS[factor].format(factor=sizes[factor], inverse=dp)
    if factor is not None:
        units, names = _whole_units(found, wrong)
        if units:
            return DP_UNITS.format(units=", ".join(units), names=", ".join(names), factor=sizes[factor])
    unreduced = [report.unreduced for report in found]
    if all(u for u in unreduced) and all(within(pair, report.tolerance) for report in found
                                         for pair in (report.unreduced or {}).values()):
        return NEVER_REDUCED
    return None


def _whole_units(found: list[DataParallelRun],
                 wrong: dict[int, dict[str, Difference | None]]) -> tuple[list[str], list[str]]:
    """``(units, parameters)``: the FSDP2 units every parameter of which is off, and those parameters, where every
    parameter off belongs to one of them and every other unit's are right on every rank; empty where that does
    not hold (or no stage holds an FSDP2 unit)."""
    off_units: set[str] = set()
    right_units: set[str] = set()
    for rank, report in enumerate(found):
        if not report.units or set(report.units) != set(report.grads):
            return [], []
        for label, unit in report.units.items():
            (off_units if label in wrong[rank] else right_units).add(unit)
    if off_units & right_units or not right_units:
        return [], []
    names = dict.fromkeys(label for pairs in wrong.values() for label in pairs)
    return sorted(off_units), list(names)
