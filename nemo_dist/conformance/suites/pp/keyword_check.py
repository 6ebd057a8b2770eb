"""The keyword check: keyword inputs (packed ``position_ids``) reach every stage of the pipeline.

torch's schedules take a model's keyword inputs as ``schedule.step(*args,
target=..., losses=..., **kwargs)``, split them into microbatches on their
first dim like the inputs, and hand each microbatch's to every stage of the
rank whose step got them (``PipelineStage.forward_one_chunk``: positional
inputs reach the first stage only, the later ones receive activations;
keyword inputs reach each stage through its own rank's step). The suite
gives ``position_ids=`` to the step on every rank (``--pp-step``'s function
gets them as a keyword argument) and compares with one process given the
same positions (:mod:`.keywords`).
"""

from __future__ import annotations

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.engine.registry import WorldLike, failure
from nemo_dist.conformance.suites.pp import keywords, target
from nemo_dist.conformance.suites.pp.causes import KEYWORDS_FIRST_STAGE_ONLY, pp_check
from nemo_dist.conformance.suites.pp.checks import differing, in_turn, stage_list
from nemo_dist.conformance.suites.pp.messages import KeywordRun
from nemo_dist.conformance.suites.pp.ranks import within

__all__ = ["keyword_inputs_reach_every_stage"]


@pp_check("pp.keyword_inputs_reach_every_stage", tier="extended")
def keyword_inputs_reach_every_stage(world: WorldLike, impl: Implementation) -> None:
    """Keyword inputs reach every stage: with packed ``position_ids`` (positions restarting inside each row) given
    to ``schedule.step`` as keyword inputs on every rank, the loss and every gradient equal one process's given
    the same positions. One schedule a world (taken in turn by world size), as many microbatches as ranks (twice
    as many where every rank refuses that count, naming microbatches), one step.

    Extended, as the tied check: it checks a feature beyond the core contract (a model taking keyword inputs
    through the schedule). NOT APPLICABLE where the model's forward, or every stage's, takes no keyword
    ``position_ids`` (torch 2.13's tracer: a stage takes only what it was traced with, and a traced keyword
    cannot reach a later stage), or where ``--pp-step``'s function takes no keyword arguments. A pipeline some
    of whose stages take the keyword and others do not fails (torch would raise ``TypeError`` in those stages'
    forward, since it hands every stage its rank's keyword inputs). The likely cause "keyword inputs reach only
    the first stage" is named only where one process whose layers outside the first stage run with their
    default positions reproduces the loss and every gradient (the suite's own model). A pipeline every rank
    refuses to build is NOT APPLICABLE here (the core checks judge it).
    """
    step = impl.suite_option("pp_step")
    if step is not None and not target.takes_keyword(resolve_callable(step)):
        raise NotApplicable(f"the --pp-step function takes no keyword arguments: it cannot pass {target.KEYWORD} "
                            "to schedule.step")
    where, found = in_turn(world, impl, keywords.run, f", packed {target.KEYWORD} as keyword inputs")
    stages = found[0].stages
    if not found[0].model_takes:
        raise NotApplicable(f"the model's forward takes no keyword {target.KEYWORD}")
    refusing = [stage for stage in stages if not stage.takes]
    if len(refusing) == len(stages):
        raise NotApplicable(f"no stage's module takes a keyword {target.KEYWORD} (stage 0's is "
                            f"{stages[0].signature}): the pipeline takes no keyword inputs")
    if refusing:
        takers = [stage.index for stage in stages if stage.takes]
        raise AssertionError(
            f"{where}: {stage_list([s.index for s in refusing])} take no keyword {target.KEYWORD} ("
            f"{refusing[0].signature}) while {stage_list(takers)} do: torch hands every stage the keyword inputs "
            "of its rank's step, so these stages raise TypeError, and fed none they run with default positions")
    lines = _differences(found)
    if not lines:
        return
    message = f"{where}: the pipeline differs from one process given the same positions:\n" + "\n".join(lines)
    if _first_stage_only_explains(found):
        raise failure(message, KEYWORDS_FIRST_STAGE_ONLY.format(layers=", ".join(stages[0].layers) or "none"))
    raise AssertionError(message)


def _differences(found: list[KeywordRun]) -> list[str]:
    """One line per stage whose gradients differ from one process's (how many, the largest difference and where),
    and one for a loss that differs."""
    lines = []
    for rank, report in enumerate(found):
        if report.loss is not None and abs(report.loss[0] - report.loss[1]) > report.tolerance * max(
                1.0, abs(report.loss[1])):
            last = report.stages[-1].index
            lines.append(f"  the loss (stage {last}'s output, rank {rank}) is {report.loss[0]!r}, one process's "
                         f"{report.loss[1]!r}")
        for index in sorted({i for i, _ in report.grads}):
            mine = {label: pair for (i, label), pair in report.grads.items() if i == index}
            off = {label: pair for label, pair in mine.items() if not within(pair, report.tolerance)}
            lines += differing(f"  stage {index} (rank {rank}): ", off, len(mine))
    return lines


def _first_stage_only_explains(found: list[KeywordRun]) -> bool:
    """Whether on every rank the loss and every held gradient equal one process's whose layers outside the first
    stage ran with their default positions (computed on the suite's own model only)."""
    for report in found:
        if report.first_only is None or not report.first_only:
            return False
        if not all(within(pair, report.tolerance) for pair in report.first_only.values()):
            return False
        if report.loss is not None and (report.first_only_loss is None or abs(
                report.loss[0] - report.first_only_loss) > report.tolerance * max(1.0, abs(report.first_only_loss))):
            return False
    return True
