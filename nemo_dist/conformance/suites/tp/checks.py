"""Conformance checks of tensor-parallel plans: every plan judged by behaviour against the unsharded model.

Each check shards seeded models with the target (:mod:`.target`) over a
tensor-parallel group of the whole world (a world of one included: a plan
over one rank), or over ``dp 2 x tp 2`` in a world of four, and asserts in
the parent on what the ranks report (:mod:`.ranks`). Models: the suite's
tiny Llama (untied and tied; float64 throughout), each ``--tp-arch``
transformers class, or the ``--tp-model`` factory's model alone. A module
target is checked with and without sequence parallelism; a ``--tp-plan`` is
checked as it is.

Tolerances are relative to ``max(1, max |expected|)``: 1e-10 where the model
computes in float64 throughout (a row-wise layer's all-reduce sums in
another order than one matmul; the smallest silent bug measured is 1.4e-3),
2e-5 for transformers models and ``--tp-model`` ones (their norms compute
in float32 even in a float64 model). Placements, ties, head counts and the
bytes of replicated parameters across ranks are compared exactly.
"""

from __future__ import annotations

import re
from typing import Any

from nemo_dist.conformance.adapters.target_raised import Raised, split_reports
from nemo_dist.conformance.adapters.target_raised import run_reports as rank_reports
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, thorough
from nemo_dist.conformance.suites.tp import ranks
from nemo_dist.conformance.suites.tp.causes import KV_HEADS, MULTIPLIED, RANKS_DISAGREE, REPLICA_SYNC, failure, tp_check
from nemo_dist.conformance.suites.tp.messages import TPRun, UnbuiltModel
from nemo_dist.conformance.suites.tp.target import OWN_MODELS, model_names

__all__ = [
    "attention_head_counts_are_local",
    "forward_equals_unsharded",
    "gradients_equal_unsharded",
    "logits_stay_sharded_on_the_vocabulary",
    "loss_on_sharded_logits_equals_unsharded",
    "placements_are_consistent",
    "tied_embeddings_stay_tied",
    "trains_like_one_process",
]

#: The optimizer steps of every run: the checks of one model and variant share its one run (:func:`each_run`).
STEPS = (("sgd", 1), ("adam", 2))
#: The steps of a sampled world's runs (and the 2-D check's, FSDP2 on 4 ranks): one of each optimizer.
SAMPLED_STEPS = (("sgd", 1), ("adam", 1))
#: What a sampled world (:func:`~nemo_dist.conformance.engine.registry.thorough` False) runs of the suite's own models:
#: the tied one with sequence parallelism on, where a module offers it (ties, SP and TP in one run).
SAMPLE = (OWN_MODELS[1], True)


def variants(impl: Implementation) -> tuple[bool, ...]:
    """Sequence parallelism off and on for a module target; a plan as it is (its own choice)."""
    return (False,) if impl.suite_option("tp_plan") is not None else (False, True)


def label(model: str, sequence_parallel: bool, dp: int = 1) -> str:
    """How a failure names the run: the model, the mesh, and whether sequence parallelism was on."""
    return f"{model}{', sequence parallel' if sequence_parallel else ''}{f', dp {dp} x tp' if dp > 1 else ''}"


def splits(world_size: int, model: str) -> bool:
    """Whether the model's heads split over a tensor-parallel group of ``world_size`` (a user's model, named by its
    ``MODULE:NAME`` factory: try)."""
    return ":" in model or KV_HEADS % world_size == 0


def run_reports(world: WorldLike, impl: Implementation, spec: dict[str, Any]) -> list[TPRun | UnbuiltModel | Raised]:
    """Every rank's report of :func:`~.ranks.run` of ``spec``; a rank where the target raised reports
    :class:`~nemo_dist.conformance.adapters.target_raised.Raised` (a raise on some ranks only is the harness's
    ``RankFailure``, never a hang)."""
    return rank_reports(world, ranks.run, impl, spec)


def reports(world: WorldLike, impl: Implementation, model: str, sp: bool, **spec: Any) -> list[TPRun]:
    """Every rank's report of one run; a target that raised on any rank is a failure naming it and its error."""
    found = run_reports(world, impl, {"model": model, "sp": sp, **spec})
    raised, built = split_reports(found)
    unbuilt = [r for r in built if isinstance(r, UnbuiltModel)]
    if unbuilt:
        raise Unbuilt(f"{model} does not build from the suite's tiny config: {unbuilt[0].unbuilt}")
    if raised:
        first = raised[0][1]
        where = label(model, sp, spec.get("dp", 1))
        raise failure(
            f"{where}: the target raised {first.where} on rank{'s' if len(raised) > 1 else ''} "
            f"{', '.join(str(r) for r, _ in raised)} of {len(found)}: {first.error}\n{first.traceback}",
            f"the plan fails at tensor-parallel size {len(found) // spec.get('dp', 1)}: {first.error.splitlines()[0]}",
        )
    return [r for r in built if isinstance(r, TPRun)]


def raised_and_runs(found: list[TPRun | UnbuiltModel | Raised], model: str) -> tuple[dict[int, Raised], list[TPRun]]:
    """The error reports of :func:`run_reports` by rank, and the runs of the other ranks, for a check that accepts
    a refusal; a model the suite's tiny config does not build is not applicable, as :func:`each_run` says."""
    raised, built = split_reports(found)
    unbuilt = [r for r in built if isinstance(r, UnbuiltModel)]
    if unbuilt:
        raise NotApplicable(f"{model} does not build from the suite's tiny config: {unbuilt[0].unbuilt}")
    return dict(raised), [r for r in built if isinstance(r, TPRun)]


class Unbuilt(Exception):
    """A model the suite could not build (its class does not fit the tiny config): no verdict on the target."""


def matrix(world_size: int, impl: Implementation, *, only: tuple[str, bool] | None = None) -> list[tuple[str, bool]]:
    """(model, sequence_parallel) pairs a check runs in a world of ``world_size``, each model splitting over it.

    Every ``--tp-arch`` class and a ``--tp-model`` in each variant; of the
    suite's own models, the untied one in each variant and the tied one with
    sequence parallelism on where a module offers it (a tie does not depend
    on it), both as they are for a plan. In a sampled world, or where a
    check names ``only`` such a pair, that one pair of the suite's own models.
    """
    sp = max(variants(impl))
    own = [(OWN_MODELS[0], v) for v in variants(impl)] + [(OWN_MODELS[1], sp)]
    if only is not None or not thorough():
        own = [only or (SAMPLE[0], SAMPLE[1] and sp)]
    others = [(m, v) for m in model_names(impl) if m not in OWN_MODELS for v in variants(impl)]
    return [(m, v) for m, v in [*own, *others] if m in model_names(impl) and splits(world_size, m)]


def each_run(world: WorldLike, impl: Implementation, **spec: Any) -> list[tuple[str, list[TPRun]]]:
    """(label, reports) for every pair of :func:`matrix`, each one run with :data:`STEPS` (:data:`SAMPLED_STEPS` in
    a sampled world), shared by the checks; NotApplicable when no model splits over this world."""
    runs, unbuilt = [], []
    for model, sp in matrix(world.size, impl):
        try:
            steps = STEPS if thorough() else SAMPLED_STEPS
            runs.append((label(model, sp), reports(world, impl, model, sp, steps=steps, **spec)))
        except Unbuilt as exc:
            unbuilt.append(str(exc))
    if unbuilt and not runs:
        raise NotApplicable("; ".join(dict.fromkeys(unbuilt)))
    if not runs:
        raise NotApplicable(
            f"the checked models' {KV_HEADS} key-value heads do not split over {world.size} ranks "
            "(tp.indivisible_heads_refused_on_every_rank checks this world)"
        )
    return runs


def _close(pair: tuple[float, ...], tolerance: float) -> bool:
    diff, scale = pair[0], pair[1]
    return diff <= tolerance * scale


def off_gradients(report: TPRun) -> list[str]:
    """The parameters whose full gradient is missing or off the unsharded one by more than the report's tolerance."""
    return [name for name, pair in report.grads.items() if pair is None or not _close(pair, report.tolerance)]


def _replicated(report: TPRun, name: str) -> bool:
    """Whether a parameter is whole on every tensor-parallel rank (plain, or Replicate on the tp dim)."""
    return ranks.tp_replicated(report.placements[name])


@tp_check("tp.forward_equals_unsharded")
def forward_equals_unsharded(world: WorldLike, impl: Implementation) -> None:
    """Logits (gathered where sharded) and the loss equal the unsharded model's, within reduction order."""
    for where, found in each_run(world, impl):
        groups: dict[int, set[str]] = {}
        for rank, report in enumerate(found):
            groups.setdefault(rank // report.tp, set()).add(report.logits_digest)
        for rank, report in enumerate(found):
            tol = report.tolerance
            if not _close(report.logits, tol) and len(groups[rank // report.tp]) > 1:
                raise failure(
                    f"{where}: the ranks of tensor-parallel group {rank // report.tp} return different logits; "
                    f"rank {rank}'s differ from the unsharded model's by {report.logits[0]:.3g}",
                    RANKS_DISAGREE,
                )
            assert _close(report.logits, tol), (
                f"{where}, rank {rank}: logits ({report.logits_form}) differ from the unsharded model's by "
                f"{report.logits[0]:.3g} (tolerance {tol:g} x {report.logits[1]:.3g})"
            )


@tp_check("tp.gradients_equal_unsharded")
def gradients_equal_unsharded(world: WorldLike, impl: Implementation) -> None:
    """Every parameter's full gradient, replicated norms included, equals the unsharded model's after backward."""
    for where, found in each_run(world, impl):
        for rank, report in enumerate(found):
            tol = report.tolerance
            missing = [name for name, pair in report.grads.items() if pair is None]
            assert not missing, f"{where}, rank {rank}: no gradient for {', '.join(missing)}"
            wrong = {name: pair for name, pair in report.grads.items() if pair is not None and not _close(pair, tol)}
            if not wrong:
                continue
            lines = "\n".join(
                f"  {name} {report.placements[name].placements or 'plain'}: off by {pair[0]:.3g} "
                f"({pair[2]:.4g} times the unsharded gradient)"
                for name, pair in wrong.items()
            )
            message = f"{where}, rank {rank}: full gradients differ from the unsharded model's:\n{lines}"
            size = report.tp
            if all(abs(pair[2] - size) < 1e-6 * size for pair in wrong.values()):
                raise failure(message, MULTIPLIED.format(size=size))
            if all(_replicated(report, name) for name in wrong):
                raise failure(message, REPLICA_SYNC)
            raise AssertionError(message)


@tp_check("tp.trains_like_one_process")
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """After SGD and Adam steps every full parameter equals one process's; replicated ones identical on every rank."""
    for where, found in each_run(world, impl):
        assert_trained(where, found)


def _steps_text(steps: tuple[tuple[str, int], ...]) -> str:
    return " and ".join(f"{count} {kind.upper() if kind == 'sgd' else kind.title()} step{'s' if count > 1 else ''}"
                        for kind, count in steps)


def assert_trained(where: str, found: list[TPRun]) -> None:
    for rank, report in enumerate(found):
        tol = report.tolerance
        wrong = [f"  {name}: off by {pair[0]:.3g}" for name, pair in report.params.items() if not _close(pair, tol)]
        assert not wrong, (
            f"{where}, rank {rank}: after {_steps_text(report.steps)} the full parameters differ from one "
            "process's:\n"
            + "\n".join(wrong)
        )
    groups: dict[int, list[int]] = {}
    for rank, report in enumerate(found):
        groups.setdefault(rank // report.tp, []).append(rank)
    for members in groups.values():
        first = found[members[0]].replicated
        for rank in members[1:]:
            drifted = [name for name, digest in found[rank].replicated.items() if first.get(name) != digest]
            assert not drifted, (
                f"{where}: replicated parameters differ between tensor-parallel ranks {members[0]} and {rank} "
                f"after training: {', '.join(drifted)}"
            )


@tp_check("tp.placements_are_consistent")
def placements_are_consistent(world: WorldLike, impl: Implementation) -> None:
    """Each parameter's local shard is the chunk its placements say; with more than one rank something is sharded."""
    for where, found in each_run(world, impl):
        for rank, report in enumerate(found):
            sharded = 0
            for name, info in report.placements.items():
                expected = list(info.full)
                for placement, dim_name in zip(info.placements, info.mesh or ["tp"], strict=False):
                    shard = _SHARD.fullmatch(placement)
                    if dim_name == "tp" and shard:
                        sharded += 1
                        dim, parts = int(shard["dim"]), int(shard["sf"] or 1)
                        # A strided shard (split_factor parts, each chunked over the group) holds its share of each.
                        expected[dim] = parts * _chunk(expected[dim] // parts, report.tp, report.tp_rank)
                assert list(info.local) == expected, (
                    f"{where}, rank {rank}: {name} {info.placements} holds {info.local} of {info.full}, "
                    f"expected {tuple(expected)} (split as torch.chunk over {report.tp} ranks)"
                )
            assert report.tp == 1 or sharded, (
                f"{where}: no parameter is sharded over {report.tp} tensor-parallel ranks"
            )


#: A Shard placement as DTensor's repr writes it: ``Shard(dim=0)``, or ``_StridedShard(dim=0, sf=3)``.
_SHARD = re.compile(r"_?(?:Strided)?Shard\(dim=(?P<dim>-?\d+)(?:, sf=(?P<sf>\d+))?\)")


def _chunk(rows: int, parts: int, index: int) -> int:
    """Rows of chunk ``index`` when ``rows`` are split as ``torch.chunk`` splits them (what a Shard keeps)."""
    size = -(-rows // parts)
    return max(0, min(size, rows - index * size))


@tp_check("tp.loss_on_sharded_logits_equals_unsharded")
def loss_on_sharded_logits_equals_unsharded(world: WorldLike, impl: Implementation) -> None:
    """The mean cross entropy (under ``loss_parallel()`` for vocabulary-sharded logits) equals the unsharded loss."""
    for where, found in each_run(world, impl):
        for rank, report in enumerate(found):
            got, want = report.loss
            tol = report.tolerance
            assert abs(got - want) <= tol * max(1.0, abs(want)), (
                f"{where}, rank {rank}: the loss on logits {report.logits_form} is {got!r}, the unsharded "
                f"model's {want!r}"
            )


@tp_check("tp.tied_embeddings_stay_tied")
def tied_embeddings_stay_tied(world: WorldLike, impl: Implementation) -> None:
    """A tied embedding and head are one parameter after sharding and after training (they update as one)."""
    tied = [model for model in model_names(impl) if model == OWN_MODELS[1] or model not in OWN_MODELS]
    checked = 0
    for where, found in each_run(world, impl):
        if where.split(",")[0] not in tied or not found[0].tied_before:
            continue
        checked += 1
        for rank, report in enumerate(found):
            assert report.tied_after, f"{where}, rank {rank}: the head's weight is no longer the embedding's"
            assert report.tied_trained, f"{where}, rank {rank}: the tie is lost after training"
    if not checked:
        raise NotApplicable("no checked model ties its embedding and head")


@tp_check("tp.attention_head_counts_are_local")
def attention_head_counts_are_local(world: WorldLike, impl: Implementation) -> None:
    """Every attention's own head counts times its head size equal the width of its local q and k projections."""
    checked = 0
    for where, found in each_run(world, impl):
        for rank, report in enumerate(found):
            for attn in report.heads:
                dim = attn.head_dim
                if dim is None:  # nothing to multiply the counts by: a module keeping no head size is not judged
                    continue
                checked += 1
                assert attn.num_heads * dim == attn.q_width, (
                    f"{where}, rank {rank}: {attn.name}.num_heads is {attn.num_heads} but its q_proj holds "
                    f"{attn.q_width // dim} heads of {dim}"
                )
                if attn.k_width is not None:
                    assert attn.num_key_value_heads * dim == attn.k_width, (
                        f"{where}, rank {rank}: {attn.name}.num_key_value_heads is {attn.num_key_value_heads} "
                        f"but its k_proj holds {attn.k_width // dim} heads of {dim}"
                    )
    if not checked:
        raise NotApplicable("no attention module keeps head counts (num_heads) and a head size (head_dim) of its own "
                            "to compare")


@tp_check("tp.logits_stay_sharded_on_the_vocabulary", tier="extended", min_world=2)
def logits_stay_sharded_on_the_vocabulary(world: WorldLike, impl: Implementation) -> None:
    """A module's plans hand the suite's models' logits on as a ``Shard(-1)`` DTensor: the vocabulary never
    gathered, ``loss_parallel()`` scores them where they are (upstream's Llama-family contract)."""
    if impl.suite_option("tp_plan") is not None:
        raise NotApplicable("a --tp-plan chooses its own logits' layout; the checks score any of them")
    for where, found in each_run(world, impl):
        if where.split(",")[0] not in OWN_MODELS:
            continue
        for rank, report in enumerate(found):
            assert report.logits_form == "DTensor ['Shard(dim=2)']", (
                f"{where}, rank {rank}: logits come back as {report.logits_form}, not sharded on the vocabulary "
                "(a DTensor Shard(dim=2) of [batch, seq, vocab])"
            )
