"""Layer 2: gloo worlds of 2 ranks. The gallery of tensor-parallel plans (``tests/forks/gallery_tp_*``).

Each plan re-expresses one public pattern (its docstring names it;
``docs/tp.md`` has the table), correct or broken. A row runs as
``nemo-dist-conformance --tp-plan ... [--tp-model ...]`` runs it, the tp
checks only, and every test of that row reads its one report. In the gate
a broken row runs the checks guarding its bug (the others are ``thorough``),
and must fail exactly those it lists there, naming its cause; a correct row
runs every tp check and conforms.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.tp.causes import CAUSES, MULTIPLIED, RANKS_DISAGREE, REPLICA_SYNC
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

G = "tests.forks.gallery_tp_"
FORWARD, GRADIENTS, TRAINS = "tp.forward_equals_unsharded", "tp.gradients_equal_unsharded", "tp.trains_like_one_process"
LOSS, TIED, HEADS = "tp.loss_on_sharded_logits_equals_unsharded", "tp.tied_embeddings_stay_tied", (
    "tp.attention_head_counts_are_local"
)
PLACEMENTS, SEQUENCE = "tp.placements_are_consistent", "tp.sequence_length_not_divisible_refused_or_correct"
#: Every tp check a plan gets a verdict on in a world of 2 (the chooser's and the indivisible heads' are not
#: applicable to a plan, or in that world).
JUDGED = frozenset({FORWARD, GRADIENTS, TRAINS, LOSS, TIED, HEADS, PLACEMENTS, SEQUENCE})
#: What a plan raising in forward on every rank fails: every check but the uneven sequence's, where refusing on
#: every rank is one of the two right answers.
REFUSED = JUDGED - {SEQUENCE}


@dataclass(frozen=True)
class Row:
    """A plan (``MODULE:NAME`` under ``tests.forks``), its model factory if not the suite's, the tp checks it fails,
    the part of the likely cause the ``guards`` (the failing checks the gate runs) must name, and whether it
    needs transformers."""

    plan: str
    model: str | None = None
    failing: frozenset[str] = frozenset()
    guards: frozenset[str] = frozenset()
    cause: str | None = None
    transformers: bool = False
    #: It loads through transformers' own TP, which needs accelerate (not a gate target: skipped without it).
    accelerate: bool = False


def _cause(text: str) -> str:
    return text.split(":")[0].split(" (")[0]


_QWEN3 = G + "hf_plan:qwen3"
#: Row id -> row: correct plans, then broken ones.
GALLERY: dict[str, Row] = {
    "megatron_fg": Row("megatron_fg:plan"),
    "mlp_only_dict": Row("mlp_only:PLAN"),
    "tied_colwise_embedding": Row("tied_colwise_embedding:plan"),
    "fused_qkv_strided": Row("fused_qkv_strided:plan", G + "fused_qkv_strided:model"),
    "dropout_shared": Row("dropout_shared:plan", G + "dropout_shared:model"),
    "hf_plan_qwen3": Row("hf_plan:plan", _QWEN3, transformers=True),
    "hf_from_pretrained_qwen3": Row(
        "hf_from_pretrained:plan", G + "hf_from_pretrained:qwen3", transformers=True, accelerate=True
    ),
    # Correct on sequences TP divides; an uneven one aborts a rank in gloo (a collective size mismatch).
    "torchtitan": Row("torchtitan:plan", failing=frozenset({SEQUENCE}), guards=frozenset({SEQUENCE})),
    "no_input_grad_allreduce": Row(
        "no_input_grad_allreduce:plan", failing=frozenset({GRADIENTS, TRAINS, SEQUENCE}),
        guards=frozenset({GRADIENTS}),
    ),
    "allreduce_twice": Row(
        "allreduce_twice:plan", failing=frozenset({GRADIENTS, TRAINS, SEQUENCE}), guards=frozenset({GRADIENTS}),
    ),
    "sp_norms_plain": Row(
        "sp_norms_plain:plan", failing=frozenset({GRADIENTS, TRAINS, SEQUENCE}), guards=frozenset({GRADIENTS}),
        cause=_cause(REPLICA_SYNC),
    ),
    "rowwise_partial": Row(
        "rowwise_partial:plan", failing=frozenset({FORWARD, GRADIENTS, TRAINS, LOSS, SEQUENCE}),
        guards=frozenset({FORWARD}),
    ),
    "local_vocab_logits": Row(
        "local_vocab_logits:plan", failing=REFUSED, guards=frozenset({FORWARD}),
        cause="the plan fails at tensor-parallel size 2: ValueError: logits of shape (2, 8, 16) where the unsharded "
        "model gives (2, 8, 32)",
    ),
    "untied": Row(
        "untied:plan", failing=frozenset({TIED, GRADIENTS, TRAINS}), guards=frozenset({TIED}),
        cause=_cause(CAUSES["tied_embeddings_stay_tied"]),
    ),
    "sequence_tiled": Row(
        "sequence_tiled:plan", failing=frozenset({GRADIENTS, TRAINS, SEQUENCE}), guards=frozenset({GRADIENTS}),
        cause=MULTIPLIED.format(size=2).split(" (")[0],
    ),
    "bias_before_allreduce": Row(
        "bias_before_allreduce:plan", G + "bias_before_allreduce:model",
        failing=frozenset({FORWARD, GRADIENTS, TRAINS, LOSS, SEQUENCE}), guards=frozenset({FORWARD}),
    ),
    "qk_norm_not_summed": Row(
        "qk_norm_not_summed:plan", _QWEN3, failing=frozenset({GRADIENTS, TRAINS, SEQUENCE}),
        guards=frozenset({GRADIENTS}), cause=_cause(REPLICA_SYNC), transformers=True,
    ),
    "dropout_per_rank": Row(
        "dropout_per_rank:plan", G + "dropout_shared:model",
        failing=frozenset({FORWARD, GRADIENTS, TRAINS, LOSS, SEQUENCE}), guards=frozenset({FORWARD}),
        cause=_cause(RANKS_DISAGREE),
    ),
    "heads_halved_replicated": Row(
        "heads_halved_replicated:plan", failing=REFUSED, guards=frozenset({FORWARD, HEADS}),
        cause="the plan fails at tensor-parallel size 2: RuntimeError: shape '[2, 8, 4, 4]' is invalid",
    ),
    "fused_qkv_naive": Row(
        "fused_qkv_naive:plan", G + "fused_qkv_naive:phi3", failing=REFUSED, guards=frozenset({FORWARD}),
        cause="the plan fails at tensor-parallel size 2: RuntimeError: The size of tensor a", transformers=True,
    ),
}
#: Correct rows whose run shows nothing the gate's correct rows do not: thorough.
THOROUGH = frozenset({"tied_colwise_embedding", "torchtitan"})

_REPORTS: dict[tuple[str, bool], tuple[Report, str]] = {}


def _report(name: str, whole: bool, world_factory: WorldFactory) -> tuple[Report, str]:
    """Row ``name``'s one report in this process: every tp check (``whole``) or its guards alone, in a world of 2."""
    key = (name, whole)
    if key not in _REPORTS:
        row = GALLERY[name]
        if row.transformers:
            targets.import_target("transformers")
        if row.accelerate:
            pytest.importorskip("accelerate", reason="transformers' TP loading needs accelerate (not a gate target)")
        options = {"tp_plan": G + row.plan, "tp_model": row.model}
        impl, components = resolve_implementation(suite_options=options)
        validate_implementation(impl, components)
        checks = select_checks(load_checks().values(), impl, "all", None, components)
        if not whole:
            checks = [c for c in checks if c.name in row.guards]
        report = run_checks(checks, impl, (2,), worlds=world_factory, components=components)
        _REPORTS[key] = (report, format_report(report))
    return _REPORTS[key]


def _params(names: list[str], *, thorough: frozenset[str] = frozenset()) -> list[object]:
    return [
        pytest.param(
            n, id=n,
            marks=[pytest.mark.xdist_group(name=f"tp_gallery_{n}"), *([pytest.mark.thorough] if n in thorough else [])],
        )
        for n in names
    ]


_BROKEN = [n for n, row in GALLERY.items() if row.guards]
_CORRECT = [n for n, row in GALLERY.items() if not row.failing]


@pytest.mark.parametrize("name", _params(_CORRECT, thorough=THOROUGH))
def test_correct_plan_conforms_on_every_tp_check(name: str, world_factory: WorldFactory) -> None:
    """A correct plan passes every tp check that applies in a world of 2, whatever its placements or style."""
    report, table = _report(name, True, world_factory)
    assert report.exit_code() == 0, table
    passed = {v.check for v in report.verdicts if v.outcome == "pass"}
    assert passed >= {FORWARD, GRADIENTS, TRAINS, LOSS, PLACEMENTS}, table


@pytest.mark.parametrize("name", _params(_BROKEN))
def test_broken_plan_fails_its_guards_naming_the_cause(name: str, world_factory: WorldFactory) -> None:
    """The checks guarding a row's bug fail, each naming the row's likely cause (or carrying the plan's error)."""
    row = GALLERY[name]
    report, table = _report(name, False, world_factory)
    failed = {v.check for v in report.verdicts if v.failed}
    assert failed == row.guards, table
    if row.cause is not None:
        assert all(row.cause in (v.cause or "") for v in report.verdicts if v.failed), table
    else:  # nothing proves a cause: the failure says what differs and names none
        assert not [v.cause for v in report.verdicts if v.failed and v.cause], table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.parametrize("name", _params(_BROKEN, thorough=frozenset(_BROKEN)))
def test_plan_fails_exactly_its_stated_checks(name: str, world_factory: WorldFactory) -> None:
    """Every tp check run, a row fails exactly the checks it states, none hanging."""
    row = GALLERY[name]
    report, table = _report(name, True, world_factory)
    assert {v.check for v in report.verdicts if v.failed} == row.failing, table
    assert report.exit_code() == (1 if row.failing else 0), table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.parametrize(
    "tp_input",
    [pytest.param(None, id="features-by-default"), pytest.param(G + "mlp_only:scaled_features", id="tp-input")],
)
def test_a_model_starting_with_a_linear_is_fed_features_or_the_declared_input(
    tp_input: str | None, world_factory: WorldFactory
) -> None:
    """``--tp-model`` of a model whose first layer is a Linear conforms under its plan dict, fed float64 features
    (the default) or what ``--tp-input`` makes."""
    options = {"tp_plan": G + "mlp_only:FEATURE_PLAN", "tp_model": G + "mlp_only:feature_mlp", "tp_input": tp_input}
    impl, components = resolve_implementation(suite_options=options)
    validate_implementation(impl, components)
    checks = [c for c in select_checks(load_checks().values(), impl, "all", None, components)
              if c.name in {FORWARD, GRADIENTS, TRAINS}]
    report = run_checks(checks, impl, (2,), worlds=world_factory, components=components)
    table = format_report(report)
    assert [v.outcome for v in report.verdicts] == ["pass"] * 3, table
    assert "tp=" + G + "mlp_only:FEATURE_PLAN" in table, table


@pytest.mark.xdist_group(name="tp_gallery_raises_on_one_rank")
def test_a_plan_raising_on_one_rank_shows_its_exception_never_a_hang(world_factory: WorldFactory) -> None:
    """Rank 1 raises while parallelizing, rank 0 waits for it in the forward's all-reduce: the check FAILs with rank
    1's exception (before, the target's error was returned and rank 0's wait was reported as a HANG)."""
    impl, components = resolve_implementation(suite_options={"tp_plan": G + "raises_on_one_rank:plan"})
    checks = [c for c in select_checks(load_checks().values(), impl, "all", None, components) if c.name == FORWARD]
    report = run_checks(checks, impl, (2,), worlds=world_factory, components=components, min_deadline=2.0)
    table = format_report(report)
    assert [v.outcome for v in report.verdicts] == ["fail"], table
    assert "rank 1 raised" in report.verdicts[0].message, table
    assert "RuntimeError: this plan breaks on rank 1" in report.verdicts[0].message, table
