"""The virtual-stage check: two stages a rank, round robin and in a V, where the schedule runs them, equal one process.

torch's multi-stage schedules run ``2 * pp`` stages on ``pp`` ranks:
Interleaved1F1B (and LoopedBFS, InterleavedZeroBubble) round robin, rank r
holding stages r and r + pp; ZBVZeroBubble (and DualPipeV) in a V, rank r
holding stages r and 2 * pp - 1 - r. A function that builds its stages
for one placement and hands them to a schedule of the other makes the ranks
exchange with the wrong peers (measured: an abort, not an error). The check
names each schedule to the function (``schedule=NAME``), reads where the
stages are before any step (:mod:`.placement`), then judges the run as the
core checks judge theirs.
"""

from __future__ import annotations

from nemo_dist.conformance.adapters.target_raised import split_reports
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.engine.registry import WorldLike, thorough
from nemo_dist.conformance.suites.pp import target
from nemo_dist.conformance.suites.pp.causes import pp_check
from nemo_dist.conformance.suites.pp.checks import (
    describe,
    judge_gradients,
    judge_held,
    judge_loss,
    judge_training,
    raised_message,
    refused_alike,
    run_reports,
    steps_of,
)
from nemo_dist.conformance.suites.pp.placement import fail_if_misplaced

__all__ = ["VIRTUAL", "virtual_stages_equal_one_process"]

#: The schedules the check names, with torch's class of each: two stages a rank round robin, then in a V.
VIRTUAL = {"Interleaved1F1B": "ScheduleInterleaved1F1B", "ZBVZeroBubble": "ScheduleZBVZeroBubble"}


@pp_check("pp.virtual_stages_equal_one_process")
def virtual_stages_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Asked for Interleaved1F1B and for ZBVZeroBubble (two stages a rank, round robin and in a V), with twice as
    many microbatches as ranks, the pipeline places every stage on the rank the schedule runs it on, its stages
    hold every parameter once, and the loss, every gradient and every parameter after the steps equal one
    process's. Both schedules in the run's smallest world, one (taken in turn) in the others.

    NOT APPLICABLE where the function takes no ``schedule`` keyword, or where for both schedules it refuses on
    every rank alike while building, or builds another schedule than the one named (it runs no virtual stages;
    each reason shown). A stage held elsewhere than where the schedule's stage maps run it fails before any step,
    naming the stages and, where the layout is exactly one style for the other, the cause.
    """
    if not target.takes_keyword(resolve_callable(impl.suite_option("pp_fn")), "schedule"):
        raise NotApplicable("the pipeline function takes no keyword schedule: it builds only its own schedule")
    skipped = []
    names = list(VIRTUAL) if thorough() else [list(VIRTUAL)[world.size % len(VIRTUAL)]]
    for schedule in names:
        cls = VIRTUAL[schedule]
        microbatches = 2 * world.size
        where = describe(schedule, world.size, microbatches) + ", two stages a rank"
        spec = {"microbatches": microbatches, "schedule": schedule, "steps": steps_of(impl)}
        raised, found = split_reports(run_reports(world, impl, spec))
        alike = refused_alike(raised, world.size)
        if alike is not None:
            skipped.append(f"{schedule}: every rank refuses it while building ({alike.error})")
            continue
        if raised:
            raise AssertionError(raised_message(where, raised, world.size))
        if found[0].schedule != cls:
            skipped.append(f"{schedule}: the function built {found[0].schedule}")
            continue
        fail_if_misplaced(where, found)
        judge_held(where, found)
        judge_loss(where, found)
        judge_gradients(where, found)
        judge_training(where, found)
    if len(skipped) == len(names):
        raise NotApplicable("the pipeline runs no virtual stages: " + "; ".join(skipped))
