"""Checks of a plan at the edges of its mesh: sequences TP does not divide, heads that do not split, (dp, tp).

A sequence length TP does not divide (under sequence parallelism) must be
refused on every rank with an error, or handled correctly; never tiled,
truncated or refused on some ranks only (torchtitan 1306, pytorch 129355).
In a world whose size does not divide the model's heads, parallelizing must
raise on every rank. On ``dp 2 x tp 2`` (a world of four) the plan composed
with FSDP2 over ``dp_shard`` trains like one process on the whole batch.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.tp import ranks
from nemo_dist.conformance.suites.tp.causes import KV_HEADS, tp_check
from nemo_dist.conformance.suites.tp.checks import (
    SAMPLED_STEPS,
    assert_trained,
    label,
    matrix,
    off_gradients,
    raised_and_runs,
    reports,
    run_reports,
    variants,
)
from nemo_dist.conformance.suites.tp.target import OWN_MODELS, TWO_KV_HEADS, model_names

__all__ = [
    "explicit_plan_comes_first",
    "fsdp2_on_a_dp_tp_mesh_trains_like_one_process",
    "indivisible_heads_refused_on_every_rank",
    "sequence_length_not_divisible_refused_or_correct",
]


@tp_check("tp.sequence_length_not_divisible_refused_or_correct", min_world=2, sampled=False, once=True)
def sequence_length_not_divisible_refused_or_correct(world: WorldLike, impl: Implementation) -> None:
    """A sequence one token longer than a multiple of TP: refused on every rank, or logits and gradients correct."""
    seq = 2 * world.size + 1
    checked = 0
    sequence_parallel = max(variants(impl))  # a module's plans with it on; a plan as it is
    for model, sp in matrix(world.size, impl, only=(OWN_MODELS[0], sequence_parallel)):
        if sp == sequence_parallel:
            found = run_reports(world, impl, {"model": model, "sp": sp, "seq": seq})
            where = f"{label(model, sp)}, sequence of {seq} over {world.size} ranks"
            errors, runs = raised_and_runs(found, model)
            raised = list(errors)
            checked += 1
            if raised:
                assert len(raised) == len(found), (
                    f"{where}: refused on rank{'s' if len(raised) > 1 else ''} {raised} only "
                    f"({errors[raised[0]].error}); the others went on"
                )
                continue
            for rank, report in enumerate(runs):
                tol = report.tolerance
                diff, scale = report.logits[:2]
                assert diff <= tol * scale, f"{where}, rank {rank}: logits off by {diff:.3g} ({report.logits_form})"
                wrong = off_gradients(report)
                assert not wrong, f"{where}, rank {rank}: gradients differ for {', '.join(wrong)}"
    if not checked:
        raise NotApplicable(f"the checked models' {KV_HEADS} key-value heads do not split over {world.size} ranks")


@tp_check("tp.fsdp2_on_a_dp_tp_mesh_trains_like_one_process", min_world=4, max_world=4)
def fsdp2_on_a_dp_tp_mesh_trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """On dp 2 x tp 2 with FSDP2 over dp_shard: outputs, gradients and parameters after steps equal one process's."""
    for model, sp in matrix(world.size, impl, only=(OWN_MODELS[1], max(variants(impl)))):
        where = label(model, sp, dp=2)
        found = reports(world, impl, model, sp, dp=2, steps=SAMPLED_STEPS)
        for rank, report in enumerate(found):
            tol = report.tolerance
            diff, scale = report.logits[:2]
            assert diff <= tol * scale, f"{where}, rank {rank}: logits of its rows off by {diff:.3g}"
            wrong = off_gradients(report)
            assert not wrong, (
                f"{where}, rank {rank}: full gradients differ from one process's on the whole batch for "
                f"{', '.join(wrong)}"
            )
        assert_trained(where, found)


@tp_check(
    "tp.indivisible_heads_refused_on_every_rank", tier="extended", min_world=3, max_world=4, sampled=False, rule=None
)
def indivisible_heads_refused_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """Heads a world does not divide (the suite's 4 key-value heads over 3 ranks, its 2-key-value-head variant over 4,
    or a ``--tp-model``'s over 3) are refused on every rank with an error naming the heads, or computed right."""
    if world.size == 3:
        model = model_names(impl)[0]  # a --tp-model's own, else the suite's untied Llama
    elif impl.suite_option("tp_model") is None:
        model = TWO_KV_HEADS
    else:
        raise NotApplicable("a --tp-model is checked for indivisible heads in a world of 3")
    for sp in variants(impl):
        found = run_reports(world, impl, {"model": model, "sp": sp})
        where = f"{label(model, sp)} over {world.size} ranks"
        errors, runs = raised_and_runs(found, model)
        raised = list(errors)
        if len(raised) == len(found):
            unclear = [rank for rank in raised if "head" not in errors[rank].error.lower()]
            assert not unclear, (
                f"{where}: refused on every rank, but not naming the heads: {errors[unclear[0]].error} (raised "
                f"{errors[unclear[0]].where})"
            )
            continue
        assert not raised, f"{where}: refused on ranks {raised} only; the others went on"
        for rank, report in enumerate(runs):
            tol = report.tolerance
            diff, scale = report.logits[:2]
            assert diff <= tol * scale, (
                f"{where}, rank {rank}: heads that do not split over {world.size} ranks accepted, and the logits "
                f"are off by {diff:.3g}"
            )


@tp_check("tp.explicit_plan_comes_first", min_world=2, max_world=2, sampled=False, once=True)
def explicit_plan_comes_first(world: WorldLike, impl: Implementation) -> None:
    """A module given ``tp_shard_plan=`` (the head alone) applies that plan, before any plan of its own choosing."""
    if impl.suite_option("tp_plan") is not None:
        raise NotApplicable("a --tp-plan is the plan itself: there is no plan chooser to check")
    where = f"{OWN_MODELS[0]} with tp_shard_plan={{'lm_head': ColwiseParallel(...)}}"
    found = reports(world, impl, OWN_MODELS[0], False, explicit=True)
    for rank, report in enumerate(found):
        sharded = sorted(name for name, info in report.placements.items() if not ranks.tp_replicated(info))
        assert sharded == ["lm_head.weight"], (
            f"{where}, rank {rank}: sharded over tp: {', '.join(sharded) or 'nothing'}; the explicit plan shards "
            "lm_head.weight alone"
        )
        diff, scale = report.logits[:2]
        assert diff <= report.tolerance * scale, f"{where}, rank {rank}: logits off by {diff:.3g}"
