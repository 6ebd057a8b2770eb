"""Layer 2: gloo worlds of 2 ranks. The gallery of pipelines (``tests/forks/gallery_pp_*``).

Each row re-expresses one public pattern (its docstring names it;
``docs/pp.md`` has the table) and runs as ``nemo-dist-conformance --pp-fn
...`` runs it, every pp check, in a world of 2 (the whole matrix: 1, 2 and 4
microbatches). A correct row conforms; a broken one fails exactly the checks
it lists, each naming the row's cause where the numbers prove one and
naming none where they do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

G = "tests.forks.gallery_pp_"
BUNDLED = "nemo_dist.distributed.pipeline_parallel:build_pipeline"
HELD, LOSS = "pp.stages_hold_every_parameter_once", "pp.loss_equals_one_process"
GRADIENTS, TRAINS = "pp.gradients_equal_one_process", "pp.trains_like_one_process"
TIED, KEYWORDS = "pp.tied_weights_summed_or_refused", "pp.keyword_inputs_reach_every_stage"
DP, VIRTUAL = "pp.data_parallel_trains_like_one_process", "pp.virtual_stages_equal_one_process"
ACCUMULATION = "pp.accumulated_steps_equal_one_process"
#: The core checks: what a row runs unless it says otherwise.
CORE = frozenset({HELD, LOSS, GRADIENTS, TRAINS})
#: Every pp check of a world of 2.
EVERY = CORE | {TIED, KEYWORDS, VIRTUAL, ACCUMULATION}


@dataclass(frozen=True)
class Row:
    """A pipeline function (``MODULE:NAME``), its pp options, and per failing check the start of the cause it must
    name (None: it must name none, saying only what differs)."""

    fn: str
    options: Mapping[str, str] = field(default_factory=dict)
    failing: Mapping[str, str | None] = field(default_factory=dict)
    #: Test targets the row imports (skipped without them, failed under ``--require-targets``).
    needs: tuple[str, ...] = ()
    #: The checks the row runs (default: the core ones): a row whose pipeline raises shows it in any one.
    only: frozenset[str] = CORE
    #: Text every failure of the row shows (the pipeline's own error: where the other ranks were still busy when one
    #: raised, the harness's report of it).
    shows: str = ""
    #: The checks a correct row is not applicable to (each with a reason), among those it runs.
    not_applicable: frozenset[str] = frozenset()
    #: The world the row runs in (4: pipelines of 2 composed with data parallelism over 2).
    world: int = 2


_M = "gradients 2 times one process's (the microbatch count)"
_TIED = "each stage's copy of the tied tok_embeddings.weight (stages 0, 1) gets only its own use's gradient"
#: Row id -> row: correct pipelines, then broken ones.
GALLERY: dict[str, Row] = {
    "bundled": Row(BUNDLED, {"pp_loss": "token_sum", "pp_schedule": "GPipe,1F1B,Interleaved1F1B"}, only=EVERY),
    "tied_synced": Row(G + "tied_synced:pipeline", only=EVERY - {ACCUMULATION}, not_applicable=frozenset({VIRTUAL})),
    "torchtitan": Row(G + "torchtitan:pipeline", only=CORE | {KEYWORDS}),
    "tracer": Row(G + "tracer:pipeline"),
    # torch's tracer takes only what it traced (token ids): no stage takes a keyword input.
    "tracer_keywords": Row(G + "tracer:pipeline", only=frozenset({KEYWORDS}), not_applicable=frozenset({KEYWORDS})),
    # The bundled pipeline (scale_grads=False, upstream's) run under torch's convention: a mean loss never averaged.
    "bundled_declared_mean": Row(BUNDLED, {"pp_schedule": "1F1B"}, {GRADIENTS: _M, TRAINS: None}),
    "loss_not_averaged": Row(G + "loss_not_averaged:pipeline", failing={GRADIENTS: _M, TRAINS: None}),
    "averaged_twice": Row(G + "averaged_twice:pipeline", failing={
        LOSS: "the loss is 1/2 of one process's (one over the microbatch count)",
        GRADIENTS: "gradients 1/2 of one process's (one over the microbatch count)", TRAINS: None,
    }),
    "summed_unnormalised": Row(G + "summed_unnormalised:pipeline", failing={
        LOSS: "the loss is 12 times one process's (a microbatch's label tokens)",
        GRADIENTS: "gradients 24 times one process's (the batch's label tokens)", TRAINS: None,
    }),
    "floor_split": Row(G + "floor_split:pipeline", failing={
        HELD: "the stages hold none of layers.8: a layer dropped by the stage split", LOSS: None, GRADIENTS: None,
        TRAINS: None,
    }),
    "boundary_layer_twice": Row(G + "boundary_layer_twice:pipeline", failing={
        HELD: "layers.4 held by two stages: a layer at a stage boundary held (and run) twice", LOSS: None,
        GRADIENTS: None, TRAINS: None,
    }),
    "final_norm_twice": Row(G + "final_norm_twice:pipeline", failing={
        LOSS: "the final norm is applied twice", GRADIENTS: "the final norm is applied twice",
        TRAINS: "the final norm is applied twice",
    }),
    # Training-loop steps (--pp-step) around the bundled pipeline, upstream's contract.
    "step_upstream_loop": Row(BUNDLED, {"pp_loss": "token_sum", "pp_step": G + "steps:upstream_loop"},
                              only=CORE | {KEYWORDS}),
    "step_never_zeroes": Row(BUNDLED, {"pp_loss": "token_sum", "pp_step": G + "steps:never_zeroes"},
                             {TRAINS: "the gradients are never zeroed between steps"}),
    "step_divides_by_microbatch_tokens": Row(
        BUNDLED, {"pp_loss": "token_sum", "pp_step": G + "steps:divides_by_microbatch_tokens"},
        {GRADIENTS: _M, TRAINS: None},
    ),
    # torchtitan's split and torch's tracer on a tied model: each stage's copy gets its own use's gradient only.
    "torchtitan_tied": Row(G + "torchtitan:pipeline", failing={TIED: _TIED}, only=frozenset({TIED})),
    "tracer_tied": Row(G + "tracer:pipeline", failing={TIED: _TIED}, only=frozenset({TIED})),
    "kwargs_first_stage_only": Row(G + "kwargs_first_stage_only:pipeline", failing={
        KEYWORDS: "keyword inputs reach only the first stage: the loss and every gradient equal one process's with "
                  "the position_ids given to the first stage's layers (layers.0, layers.1, layers.2, layers.3, "
                  "layers.4)",
    }, only=frozenset({KEYWORDS})),
    "v_placed_round_robin": Row(G + "v_placed_round_robin:pipeline", {"pp_loss": "token_sum"}, {
        check: "the stages are placed round robin (rank r holds stages r, r + pp, ...) where the schedule runs them "
               "in a V" for check in (*CORE, VIRTUAL)
    }, only=CORE | {VIRTUAL}),
    # torch's scale_grads=True (torchtitan's split, a mean loss) divides the whole .grad at every step: accumulated
    # over two steps, the first step's part is divided again.
    "torchtitan_accumulation": Row(G + "torchtitan:pipeline", failing={
        ACCUMULATION: "the first step's part of the accumulated gradients is 1/2 of what it should be and the last "
                      "step's is right: torch's schedule with scale_grads=True",
    }, only=frozenset({ACCUMULATION})),
    "detached_output": Row(G + "detached_output:pipeline", failing={
        GRADIENTS: "the parameters of stage 0 get no gradient while one process's are nonzero", TRAINS: None,
    }),
}

_DP = frozenset({DP})
_TOKEN_SUM = {"pp_loss": "token_sum", "pp_schedule": "1F1B"}
#: Composed with data parallelism (FSDP2 inside each stage, as upstream composes them): pp 2 x dp 2, a world of 4.
GALLERY.update({
    "bundled_fsdp2": Row(BUNDLED, _TOKEN_SUM, only=_DP, world=4),
    "torchtitan_fsdp2": Row(G + "torchtitan:pipeline", only=_DP, world=4),
    "step_upstream_loop_fsdp2": Row(BUNDLED, {**_TOKEN_SUM, "pp_step": G + "steps:upstream_loop"}, only=_DP,
                                    world=4),
    # torch's tracer takes no dp_mesh; a step function that names none cannot count every dp rank's label tokens;
    # a function that refuses a dp_mesh on every rank says so.
    "tracer_fsdp2": Row(G + "tracer:pipeline", only=_DP, not_applicable=_DP, world=4),
    "refuses_dp": Row(G + "refuses_dp:pipeline", _TOKEN_SUM, only=_DP, not_applicable=_DP, world=4),
    "step_without_dp_mesh": Row(BUNDLED, {**_TOKEN_SUM, "pp_step": G + "steps:never_zeroes"}, only=_DP,
                                not_applicable=_DP, world=4),
    "fsdp2_root_divide_factor": Row(G + "fsdp2_root_divide_factor:pipeline", _TOKEN_SUM, {
        DP: "the parameters of the FSDP2 units stage 0's root, stage 1's root (tok_embeddings.weight, norm.weight, "
            "output.weight) are 2 times one process's and every "
            "other unit's equal it",
    }, only=_DP, world=4),
    "step_divides_without_dp_size": Row(BUNDLED, {**_TOKEN_SUM, "pp_step": G + "steps:divides_without_dp_size"}, {
        DP: "every gradient is 1/2 of one process's (one over the dp size)",
    }, only=_DP, world=4),
    "dp_mesh_ignored": Row(G + "dp_mesh_ignored:pipeline", _TOKEN_SUM, {
        DP: "the gradients are never reduced over the dp ranks: each rank's equal one process's given that rank's "
            "rows alone",
    }, only=_DP, world=4),
})

_UPSTREAM = ("transformers", "nemo_automodel.components.distributed.pipelining")
_AUTO = G + "autopipeline:"
#: Upstream's AutoPipeline (nemo-automodel 0.7.0) on a tiny transformers Llama: it conforms in float32; in float64
#: a later stage refuses the hidden state it receives (rank 1 raises in the step, rank 0 waits); it refuses a tied
#: model on every rank; with packed position_ids that differ between microbatches, each stage reuses the first
#: microbatch's causal mask for every later one (its mask cache ignores the positions). Each shown as what it is: no
#: likely cause.
GALLERY.update({
    "autopipeline": Row(_AUTO + "pipeline", {"pp_model": _AUTO + "llama", "pp_compute_dtype": "float32",
                                             "pp_loss": "token_sum"}, needs=_UPSTREAM),
    "autopipeline_qwen3": Row(_AUTO + "pipeline", {"pp_model": _AUTO + "qwen3", "pp_compute_dtype": "float32",
                                                   "pp_loss": "token_sum"}, needs=_UPSTREAM),
    "autopipeline_virtual": Row(_AUTO + "pipeline", {"pp_model": _AUTO + "llama", "pp_compute_dtype": "float32",
                                                     "pp_loss": "token_sum"}, only=frozenset({VIRTUAL}),
                                needs=_UPSTREAM),
    # Composed with upstream's FSDP2 over upstream's 5-D mesh (its mixed precision pinned to float32).
    "autopipeline_fsdp2": Row(_AUTO + "pipeline", {"pp_model": _AUTO + "llama", "pp_compute_dtype": "float32",
                                                   "pp_loss": "token_sum", "pp_schedule": "1F1B"},
                              only=_DP, needs=_UPSTREAM, world=4),
    "autopipeline_float64": Row(
        _AUTO + "pipeline", {"pp_model": _AUTO + "llama", "pp_loss": "token_sum"}, {HELD: None}, _UPSTREAM,
        frozenset({HELD}), "ValueError: inputs_embeds must be provided for pipeline stages without embed_tokens",
    ),
    "autopipeline_tied": Row(
        _AUTO + "pipeline", {"pp_model": _AUTO + "tied_llama", "pp_compute_dtype": "float32", "pp_loss": "token_sum"},
        {HELD: None}, _UPSTREAM, frozenset({HELD}),
        "building the pipeline: ValueError: Model 'Unknown' is not compatible with pipeline parallelism",
    ),
    "autopipeline_packed": Row(
        _AUTO + "pipeline", {"pp_model": _AUTO + "llama", "pp_compute_dtype": "float32", "pp_loss": "token_sum"},
        {KEYWORDS: None}, _UPSTREAM, frozenset({KEYWORDS}), "the pipeline differs from one process given the same "
        "positions:\n  stage 0 (rank 0): 46 of 46 gradients differ",
    ),
})

_REPORTS: dict[str, tuple[Report, str]] = {}


def _report(name: str, world_factory: WorldFactory) -> tuple[Report, str]:
    """Row ``name``'s one report in this process: the pp checks it runs, in its world (of 2 unless it says)."""
    if name not in _REPORTS:
        row = GALLERY[name]
        for target in row.needs:
            targets.import_target(target)
        impl, components = resolve_implementation(suite_options={"pp_fn": row.fn, **row.options})
        validate_implementation(impl, components)
        checks = [c for c in select_checks(load_checks().values(), impl, "all", None, components)
                  if c.name in row.only]
        report = run_checks(checks, impl, (row.world,), worlds=world_factory, components=components,
                            min_deadline=2.0)
        _REPORTS[name] = (report, format_report(report))
    return _REPORTS[name]


#: Rows the gate leaves to ``--thorough``: the float64 AutoPipeline leaves rank 0 stuck, and the world restarts;
#: the Qwen3, packed, virtual-stage and FSDP2-composed AutoPipeline rows build upstream's pipeline again (seconds
#: each; the Llama row proves it in the gate).
THOROUGH = frozenset({"autopipeline_float64", "autopipeline_qwen3", "autopipeline_packed", "autopipeline_virtual",
                      "autopipeline_fsdp2"})


def _params(names: list[str]) -> list[object]:
    return [pytest.param(n, id=n, marks=[pytest.mark.xdist_group(name="pp_gallery"),
                                         *([pytest.mark.thorough] if n in THOROUGH else [])]) for n in names]


@pytest.mark.parametrize("name", _params([n for n, row in GALLERY.items() if not row.failing]))
def test_correct_pipeline_conforms_on_every_pp_check(name: str, world_factory: WorldFactory) -> None:
    """A correct pipeline passes every pp check it runs in a world of 2, whatever its style."""
    report, table = _report(name, world_factory)
    row = GALLERY[name]
    assert report.exit_code() == 0, table
    assert {v.check for v in report.verdicts if v.outcome == "pass"} == row.only - row.not_applicable, table
    assert {v.check for v in report.verdicts if v.outcome == "not applicable"} == row.not_applicable, table


@pytest.mark.parametrize("name", _params([n for n, row in GALLERY.items() if row.failing]))
def test_broken_pipeline_fails_its_checks_each_naming_its_cause(name: str, world_factory: WorldFactory) -> None:
    """A broken row fails exactly the checks it lists, none hanging; each names the row's cause, or none."""
    row = GALLERY[name]
    report, table = _report(name, world_factory)
    failed = {v.check: v for v in report.verdicts if v.failed}
    assert set(failed) == set(row.failing), table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table
    for check, cause in row.failing.items():
        found = failed[check].cause or ""
        assert found.startswith(cause) if cause else not found, (check, table)
        assert row.shows in failed[check].message, (check, table)


@pytest.mark.xdist_group(name="pp_gallery")
def test_a_pipeline_raising_on_one_rank_shows_its_exception_never_a_hang(world_factory: WorldFactory) -> None:
    """Rank 1 raises while building, rank 0 waits for it in the schedule's first send: the check FAILs with rank
    1's exception, not a HANG."""
    impl, components = resolve_implementation(suite_options={"pp_fn": G + "raises_on_one_rank:pipeline"})
    checks = [c for c in select_checks(load_checks().values(), impl, "all", None, components) if c.name == HELD]
    report = run_checks(checks, impl, (2,), worlds=world_factory, components=components, min_deadline=2.0)
    table = format_report(report)
    assert [v.outcome for v in report.verdicts] == ["fail"], table
    assert "rank 1 raised" in report.verdicts[0].message, table
    assert "RuntimeError: this pipeline breaks on rank 1" in report.verdicts[0].message, table


#: Every schedule torch 2.13 has, as ``--pp-schedule`` names them.
EVERY_SCHEDULE = "GPipe,1F1B,Interleaved1F1B,LoopedBFS,InterleavedZeroBubble,ZBVZeroBubble,DualPipeV"


@pytest.mark.thorough
@pytest.mark.parametrize("size", [pytest.param(s, id=f"pp{s}", marks=pytest.mark.xdist_group(name="pp_gallery"))
                                  for s in (2, 4)])
def test_the_bundled_pipeline_conforms_under_every_schedule_and_microbatch_count(
    size: int, world_factory: WorldFactory
) -> None:
    """The exhaustive matrix: the bundled pipeline under each of torch's seven schedules (two stages a rank, in a
    V for ZBVZeroBubble and DualPipeV, where not one) with 1, 2 and 4 microbatches, at pp 2 and pp 4 (the counts
    a schedule refuses on every rank skipped), passes every pp check."""
    options = {"pp_fn": BUNDLED, "pp_loss": "token_sum", "pp_schedule": EVERY_SCHEDULE}
    impl, components = resolve_implementation(suite_options=options)
    validate_implementation(impl, components)
    checks = select_checks(load_checks().values(), impl, "all", None, components)
    report = run_checks(checks, impl, (size,), worlds=world_factory, components=components)
    table = format_report(report)
    assert report.exit_code() == 0, table
    assert {v.check for v in report.verdicts if v.outcome == "pass"} == EVERY | ({DP} if size == 4 else set()), table
