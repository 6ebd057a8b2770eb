"""Layer 2: gloo worlds of 2 ranks. The gallery of expert parallelism (``tests/forks/gallery_moe_*``).

Each row re-expresses one public pattern (its docstring names it;
``docs/moe.md`` has the table) and runs as ``nemo-dist-conformance
--moe-fn ...`` runs it, every moe check, in a world of 2 (the suite's 12
experts, 6 a rank). A correct row conforms; a broken one fails exactly the
checks it lists, naming its cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.moe import causes
from nemo_dist.conformance.suites.moe.checks import SHARDING_CHANGED
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

G = "tests.forks.gallery_moe_"
BUNDLED = "nemo_dist.distributed.expert_parallel:parallelize_experts"
FORWARD, GRADIENTS = "moe.forward_equals_one_process", "moe.gradients_equal_one_process"
TRAINS, SHARDED = "moe.trains_like_one_process", "moe.experts_sharded_over_ep"


@dataclass(frozen=True)
class Row:
    """An expert-parallel function (``MODULE:NAME``), the moe checks it fails and what its first failure names."""

    fn: str
    failing: frozenset[str] = frozenset()
    cause: str | None = None
    #: Further moe options of the row (``moe_layer``, ``moe_compute_dtype``).
    options: Mapping[str, str] = field(default_factory=dict)
    #: The first parameter the report's placements note names.
    first_parameter: str = "router.weight"
    #: A test target the row needs (skipped without it, failed under ``--require-targets``).
    needs: str | None = None
    #: The checks that HANG (a subset of ``failing``): the run of a scenario where a rank receives no pair.
    hanging: frozenset[str] = frozenset()
    #: The failing checks whose failure proves no cause (they say what differs and print none).
    uncaused: frozenset[str] = frozenset()
    #: Text every failure of the row shows.
    shows: str = ""


def _cause(text: str) -> str:
    return text.split(":")[0]


def _experts_scaled(factor: float, implied: str) -> str:
    """The start of the cause of expert gradients off by an exact ``factor`` (the sizes it ``implied``)."""
    what = "the gradients of experts.w1, experts.w2 are"
    return causes.FACTOR.format(what=what, factor=factor, implied=f" ({implied}")


#: A composition averaged over the data-parallel ranks.
COMPOSED_MEAN = {"moe_mesh": "edp,ep", "moe_reduction": "mean"}
#: A composition as upstream's recipe runs one: each rank's loss times the data-parallel size, every gradient
#: averaged over the data-parallel ranks, an auxiliary loss injected in backward (so averaged).
AUX_MEAN = {"moe_mesh": "edp,ep", "moe_reduction": "sum", "moe_loss_scale": "@dp", "moe_aux_reduction": "mean",
            "moe_layer": G + "aux:layer"}
#: Upstream's composition (apply_ep, apply_fsdp, its recipe's loss multiplier and gradient scaling) on its own
#: layer, which gathers its routing weights in float32; its aux loss declared averaged as its recipe gives it.
UPSTREAM_COMPOSED = {"moe_layer": G + "upstream:composed_layer", "moe_compute_dtype": "float32",
                     "moe_mesh": "edp,ep", "moe_reduction": "sum", "moe_loss_scale": "@dp",
                     "moe_aux_reduction": "mean", "moe_after_backward": G + "upstream:scale_grads"}
#: The same with tensor parallelism: the ranks of a tp group share a batch, averaged over the data-parallel size.
TP_MEAN = {"moe_mesh": "edp,ep,tp", "moe_reduction": "mean"}

GALLERY: dict[str, Row] = {
    "bundled": Row(BUNDLED),
    # The bundled run's form: the same function given the (edp, ep) mesh makes its own data-parallel reductions.
    "bundled_composed": Row(BUNDLED, options={"moe_mesh": "edp,ep"}),
    "torchtitan": Row(G + "torchtitan:apply_ep"),
    "allgather_allreduce": Row(G + "allgather_allreduce:apply_ep"),
    "router_detached": Row(
        G + "router_detached:apply_ep", frozenset({GRADIENTS, TRAINS}), _cause(causes.WEIGHTS_DETACHED)
    ),
    "router_replicate_unreduced": Row(
        G + "router_replicate_unreduced:apply_ep", frozenset({GRADIENTS, TRAINS}),
        causes.UNREDUCED.format(names="router.bias, router.weight").split(":")[0],
    ),
    "expert_grads_reduced": Row(
        G + "expert_grads_reduced:apply_ep", frozenset({GRADIENTS, TRAINS}),
        causes.REDUCED_OVER_SHARDS.format(names="experts.w1, experts.w2").split(":")[0],
    ),
    "expert_grads_averaged": Row(
        G + "expert_grads_averaged:apply_ep", frozenset({GRADIENTS, TRAINS}),
        _experts_scaled(0.5, "/ W = ep = 2"),
    ),
    # Expert e's pairs reach rank e mod 2 at local index e mod 6: computed by expert (e mod 2) * 6 + e mod 6.
    "owner_round_robin": Row(
        G + "owner_round_robin:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}), _cause(causes.WRONG_EXPERTS),
        shows="",
    ),
    "weights_twice": Row(G + "weights_twice:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}),
                         _cause(causes.WEIGHTS_TWICE)),
    "dispatch_detached": Row(G + "dispatch_detached:apply_ep", frozenset({GRADIENTS}),
                             _cause(causes.DISPATCH_DETACHED)),
    "capacity": Row(
        G + "capacity:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}), _cause(causes.DROPPED_PAIRS),
    ),
    "router_bfloat16": Row(G + "router_bfloat16:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}),
                           "is within bfloat16's rounding"),
    # A rank that raised shows its exception: FAIL naming rank 1's IndexError, never a HANG of the ranks it left.
    "empty_rank_raises": Row(
        G + "empty_rank_raises:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}),
        uncaused=frozenset({FORWARD, GRADIENTS, TRAINS}), shows="rank 1 raised IndexError",
    ),
    # Compositions (--moe-mesh edp,ep): every layout of the world, edp 2 x ep 1 and edp 1 x ep 2 at 2 ranks.
    "composed_mean": Row(G + "composed:apply_ep", options=COMPOSED_MEAN),
    "composed_summed": Row(G + "composed:apply_ep_summed", options={"moe_mesh": "edp,ep"}),
    "composed_experts_averaged_over_replicas": Row(
        G + "composed_bugs:experts_averaged_over_replicas", frozenset({GRADIENTS, TRAINS}),
        _experts_scaled(2, "x W = ep = 2"),
        options=COMPOSED_MEAN,
    ),
    "composed_experts_divided_by_ep": Row(
        G + "composed_bugs:experts_divided_by_ep", frozenset({GRADIENTS, TRAINS}),
        _experts_scaled(2, "x W = edp = 2"),
        options=COMPOSED_MEAN,
    ),
    "composed_experts_divided_by_world_times_ep": Row(
        G + "composed_bugs:experts_divided_by_world_times_ep", frozenset({GRADIENTS, TRAINS}),
        _experts_scaled(0.5, "/ W = ep = 2"),
        options=COMPOSED_MEAN,
    ),
    "composed_experts_never_reduced": Row(
        G + "composed_bugs:experts_never_reduced", frozenset({GRADIENTS, TRAINS}),
        causes.UNREDUCED.format(names="experts.w1, experts.w2").split(":")[0], options=COMPOSED_MEAN,
    ),
    "composed_local_experts_averaged_over_world": Row(
        G + "composed_bugs:local_experts_averaged_over_world", frozenset({GRADIENTS, TRAINS}),
        causes.REDUCED_OVER_SHARDS.format(names="experts.w1, experts.w2").split(":")[0], options=COMPOSED_MEAN,
    ),
    "composed_dense_reduced_over_ep": Row(
        G + "composed_bugs:dense_reduced_over_ep", frozenset({GRADIENTS, TRAINS}),
        causes.UNREDUCED.format(names="router.bias, router.weight").split(":")[0], options=COMPOSED_MEAN,
    ),
    # With tensor parallelism (--moe-mesh edp,ep,tp): edp 2 x ep 1 x tp 1, 1 x 2 x 1 and 1 x 1 x 2 at 2 ranks.
    "tp_replicated": Row(G + "tp:replicated", options=TP_MEAN),
    "tp_split": Row(G + "tp:split", options=TP_MEAN),
    "tp_tokens_counted_tp_times": Row(
        G + "tp:tokens_counted_tp_times", frozenset({GRADIENTS, TRAINS}),
        _experts_scaled(2, "x W = tp = 2"),
        options=TP_MEAN,
    ),
    # The ranks of a tp group share a batch and a router replica, yet get different router gradients.
    "tp_split_router_not_reduced": Row(
        G + "tp:split_router_not_reduced", frozenset({GRADIENTS, TRAINS}),
        _cause(causes.NOT_SUMMED_OVER_TP.format(names="router.bias, router.weight", ranks="0, 1")),
        shows="router.weight off by", options=TP_MEAN,
    ),
    # torchtitan's FSDP2 composition is right; torch 2.13 divides float64 by its factor twice in edp 1 x ep 2.
    "titan_fsdp_divided": Row(
        G + "titan_fsdp:fsdp_divided", frozenset({GRADIENTS, TRAINS}),
        "torch's FSDP2 divides float64 gradients by set_gradient_divide_factor's factor (2) twice where a shard "
        "group has one rank", options=COMPOSED_MEAN,
    ),
    # An auxiliary loss injected in backward outside the loss multiplier (--moe-aux-reduction).
    "aux_averaged_over_dp": Row(G + "aux:averaged_over_dp", options=AUX_MEAN),
    "aux_averaged_over_ep": Row(
        G + "aux:averaged_over_ep", frozenset({GRADIENTS, TRAINS}),
        "each rank's auxiliary loss counts 1 of its other loss, where --moe-aux-reduction mean declares 0.5",
        options=AUX_MEAN,
    ),
    "megatron_local": Row(G + "megatron_local:apply_ep"),
    # Before the suite read a shard without a gradient as zeros: a false FAIL where a rank's experts got no pair.
    "present_experts": Row(G + "present_experts:apply_ep"),
    "present_experts_fresh_zeros": Row(
        G + "present_experts_fresh_zeros:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS}),
        hanging=frozenset({FORWARD, GRADIENTS, TRAINS}),
    ),
    # Before the suite compared a shard by its rank's coordinate on its own mesh: a false FAIL of the sharding check.
    "expert_data_parallel": Row(G + "expert_data_parallel:apply_ep"),
    "local_round_robin": Row(G + "local_round_robin:apply_ep"),
    "local_reinitialised": Row(
        G + "local_reinitialised:apply_ep", frozenset({FORWARD, GRADIENTS, TRAINS, SHARDED}),
        _cause(SHARDING_CHANGED), uncaused=frozenset({SHARDED}),
    ),
    "tokens_grad_sliced": Row(G + "tokens_grad_sliced:apply_ep", frozenset({GRADIENTS}),
                              _cause(causes.OWN_EXPERTS_ONLY)),
    "hf_ep": Row(
        G + "hf_ep:apply_ep", options={"moe_layer": G + "hf_ep:layer"},
        first_parameter="layers.0.mlp.experts.gate_up_proj", needs="transformers.distributed.expert_parallel",
    ),
    "hf_ep_batched_mm": Row(
        G + "hf_ep:apply_ep", options={"moe_layer": G + "hf_ep:layer_batched_mm"},
        first_parameter="layers.0.mlp.experts.gate_up_proj", needs="transformers.distributed.expert_parallel",
    ),
    "upstream": Row(
        G + "upstream:apply_ep",
        options={"moe_layer": G + "upstream:layer", "moe_compute_dtype": "float32"},
        first_parameter="layers.0.mlp.gate.weight",
        needs="nemo_automodel.components.moe.parallelizer",
    ),
    # Upstream's composition as its recipe trains (every layout of 4 ranks, edp 2 x ep 2 included: thorough).
    "upstream_composed": Row(
        G + "upstream:composed", options=UPSTREAM_COMPOSED, first_parameter="layers.0.mlp.gate.weight",
        needs="nemo_automodel.components.moe.parallelizer",
    ),
    # Upstream's composition with its aux loss declared as counting like the loss: the averaging is named.
    "upstream_composed_aux_undeclared": Row(
        G + "upstream:composed", frozenset({GRADIENTS, TRAINS}),
        "each rank's auxiliary loss counts 0.5 of its other loss (1 / dp = W = ep = 2: averaged over the "
        "data-parallel ranks), where --moe-aux-reduction sum declares 1",
        options={k: v for k, v in UPSTREAM_COMPOSED.items() if k != "moe_aux_reduction"},
        first_parameter="layers.0.mlp.gate.weight",
        needs="nemo_automodel.components.moe.parallelizer",
    ),
    # Upstream's layer judged as float64: its float32 routing weights under EP are named as such, not as a bug.
    "upstream_undeclared_float32": Row(
        G + "upstream:apply_ep", frozenset({GRADIENTS, TRAINS}), "is within float32's rounding",
        options={"moe_layer": G + "upstream:layer"},
        first_parameter="layers.0.mlp.gate.weight",
        needs="nemo_automodel.components.moe.parallelizer",
    ),
}

_REPORTS: dict[str, tuple[Report, str]] = {}


def _report(name: str, world_factory: WorldFactory) -> tuple[Report, str]:
    if name not in _REPORTS:
        row = GALLERY[name]
        impl, components = resolve_implementation(suite_options={"moe_fn": row.fn, **row.options})
        validate_implementation(impl, components)
        checks = select_checks(load_checks().values(), impl, "all", None, components)
        # A hang costs the deadline's floor once (the checks share each scenario's run): 2 s, not the default 10.
        report = run_checks(checks, impl, (2,), worlds=world_factory, components=components, min_deadline=2.0)
        _REPORTS[name] = (report, format_report(report))
    return _REPORTS[name]


#: What importing upstream's MoE path warns: its moe_utils compiles a function at import, which imports
#: torch._inductor, which touches the deprecated torch.jit.script_method (torch 2.13).
UPSTREAM_IMPORT = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"


@pytest.mark.filterwarnings(UPSTREAM_IMPORT)
@pytest.mark.xdist_group(name="moe_gallery")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.upstream] if (row.needs or "").startswith("nemo_automodel") else [])
        for n, row in GALLERY.items()
    ],
)
def test_expert_parallelism_fails_exactly_its_stated_checks_naming_the_cause(
    name: str, world_factory: WorldFactory
) -> None:
    """A correct row passes every moe check; a broken one fails exactly its checks, every failure naming the row's
    own cause where a diagnostic proves it and none where nothing does."""
    row = GALLERY[name]
    if row.needs is not None:
        targets.import_target(row.needs)
    report, table = _report(name, world_factory)
    assert {v.check for v in report.verdicts if v.failed} == row.failing, table
    assert report.exit_code() == (1 if row.failing else 0), table
    assert {v.check for v in report.verdicts if v.outcome == "hang"} == row.hanging, table
    for verdict in (v for v in report.verdicts if v.outcome == "fail"):
        assert row.shows in verdict.message, table
        if row.cause is None or verdict.check in row.uncaused:
            assert not verdict.cause, table
        else:
            assert row.cause in verdict.cause, table
    placed = rf"moe placements in a world of 2( \(edp \d x ep \d( x tp \d)?\))?: {re.escape(row.first_parameter)}"
    assert re.search(placed, table), table


@pytest.mark.filterwarnings(UPSTREAM_IMPORT)
@pytest.mark.xdist_group(name="moe_gallery_4")
@pytest.mark.parametrize(
    ("fn", "options", "layouts", "placed"),
    [
        pytest.param(G + "composed:apply_ep", COMPOSED_MEAN, ("edp 4 x ep 1", "edp 2 x ep 2", "edp 1 x ep 4"),
                     "router.weight plain", id="edp_ep"),
        pytest.param(G + "tp:split", TP_MEAN, ("edp 4 x ep 1 x tp 1", "edp 2 x ep 2 x tp 1", "edp 1 x ep 4 x tp 1",
                                               "edp 2 x ep 1 x tp 2", "edp 1 x ep 2 x tp 2", "edp 1 x ep 1 x tp 4"),
                     "router.weight plain", id="edp_ep_tp"),
        # FSDP2 over edp on experts Shard(0) over ep: a _StridedShard where both are 2 (read as replicas before).
        pytest.param(G + "titan_fsdp:fsdp_averaged",
                     {**COMPOSED_MEAN, "moe_after_backward": G + "titan_fsdp:divide_experts_by_ep"},
                     ("edp 4 x ep 1", "edp 2 x ep 2", "edp 1 x ep 4"), "router.weight Shard(0)", id="fsdp2_strided"),
        # Experts Shard(1) over edp (upstream's ep_shard) and Shard(0) over ep where both are 2.
        pytest.param(G + "upstream:composed", UPSTREAM_COMPOSED, ("edp 4 x ep 1", "edp 2 x ep 2", "edp 1 x ep 4"),
                     "layers.0.mlp.gate.weight Shard(0)", id="upstream",
                     marks=[pytest.mark.upstream, pytest.mark.thorough]),
    ],
)
def test_a_composition_conforms_in_every_layout_of_four_ranks(
    fn: str, options: dict[str, str], layouts: tuple[str, ...], placed: str, world_factory: WorldFactory
) -> None:
    """A mean composition conforms in a world of 4 in each layout: experts ``Shard(0)`` on the ep dim of the suite's
    mesh, each shard judged by the rank's coordinate on its own sub-mesh, not its global rank, replicas over edp
    (and tp) compared bit for bit; with tensor parallelism, ep and tp both above one in the same layout (edp 1 x
    ep 2 x tp 2), where each tp rank runs its share of the batch's tokens through experts held over ep."""
    if fn.startswith(G + "upstream"):
        targets.import_target("nemo_automodel.components.moe.parallelizer")
    impl, components = resolve_implementation(suite_options={"moe_fn": fn, **options})
    checks = select_checks(load_checks().values(), impl, "all", None, components)
    report = run_checks(checks, impl, (4,), worlds=world_factory, components=components)
    table = format_report(report)
    assert [v.outcome for v in report.verdicts] == ["pass"] * 4, table
    for layout in layouts:
        assert f"moe placements in a world of 4 ({layout}): {placed}" in table, table
