"""Layer 2: gloo worlds of 1 and 2 ranks (4 for HSDP). The gallery of sharded wrappers (FSDP2), by ``--ddp-fn``.

Each wrapper under ``tests/forks/gallery_fsdp_*`` re-expresses one public
pattern (its docstring names it; ``docs/wrappers.md`` has the table).
Each row runs once, as ``nemo-dist-conformance --ddp-fn ... --ddp-kwarg
mesh=@mesh`` runs it (the wrapper checks, every tier), and every test of
that row reads its one report: correct sharded wrappers conform with no
check crashing on a DTensor, broken ones fail the checks guarding their
bug with its likely cause, and how each parameter is sharded is noted
under the header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.adapters.wrapping import check_mesh_world_sizes, parse_wrapper
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.option_spec import command_name
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.wrapper.diagnosis import CAUSES
from nemo_dist.testing.plugin import WorldFactory

G = "tests.forks.gallery_fsdp_"
MESH = ["mesh=@mesh"]
TRAINING = frozenset(
    {"wrapper.trains_like_one_process", "wrapper.no_sync_accumulates", "wrapper.trains_a_nested_model"}
)
#: The checks whose failure a row's cause must name (the others may name another, or none).
CAUSED = frozenset({"wrapper.trains_like_one_process", "wrapper.identical_start"})


@dataclass(frozen=True)
class Row:
    """One row: the options, the world sizes, the core exit status, the wrapper checks failing, their cause's start
    (or a part of it) and the failing checks that must name it."""

    options: dict[str, Any]
    sizes: tuple[int, ...] = (1, 2)
    exit_code: int = 0
    failing: frozenset[str] = frozenset()
    cause: str | None = None
    cause_checks: frozenset[str] = CAUSED
    components: tuple[str, ...] = ("ddp", "wrapper")


def _fn(spec: str, **options: Any) -> dict[str, Any]:
    return {"ddp_fn": G + spec, "ddp_kwargs": MESH, **options}


#: Row id -> row. Correct sharded wrappers, then the broken ones.
GALLERY: dict[str, Row] = {
    "torchtitan_summed": Row(_fn("torchtitan:apply_fsdp", ddp_start="identical", ddp_reduction="sum")),
    "hsdp_2x2": Row(_fn("hsdp:apply_hsdp", ddp_start="identical", ddp_mesh="2x2"), (4,)),
    "torchtune_rank0_broadcast": Row(_fn("torchtune:shard_and_load")),
    # nemo_dist's own FSDP2 component, judged as any sharded wrapper (upstream's default policy casts no inputs:
    # the checks' float64 inputs need mixed precision off). The wrapper checks only: it takes
    # activation_checkpointing=, so the ddp checks would add the real-model checkpointing runs (README: 52 passed).
    "bundled_fsdp2": Row(
        {
            "ddp_fn": "nemo_dist.distributed.fsdp2:fsdp2_strategy_parallelize", "ddp_start": "identical",
            "ddp_kwargs": ["device_mesh=@mesh", "mp_policy=torch.distributed.fsdp:MixedPrecisionPolicy()"],
        },
        components=("wrapper",),
    ),
    "mixed_precision_declared": Row(
        _fn("mixed_precision:apply_fsdp", ddp_start="identical", ddp_compute_dtype="bfloat16")
    ),
    "cpu_offload": Row(_fn("cpu_offload:apply_fsdp", ddp_start="identical")),
    "mixed_precision_undeclared": Row(
        _fn("mixed_precision:apply_fsdp", ddp_start="identical"), exit_code=1,
        failing=TRAINING | {"wrapper.world_of_one_trains"},
        cause=CAUSES["computes_in"].split(" (")[0].format(dtype="bfloat16"),
    ),
    "bf16_reduce": Row(
        _fn("bf16_reduce:apply_fsdp", ddp_start="identical"), exit_code=1,
        failing=TRAINING | {"wrapper.world_of_one_trains", "wrapper.reduces_in_declared_dtype"},
        cause=CAUSES["reduced_in"].split(":")[0].format(dtype="bfloat16"),
    ),
    "divide_factor_on_root": Row(
        _fn("divide_factor_on_root:apply_fsdp", ddp_start="identical", ddp_reduction="sum"), exit_code=1,
        failing=frozenset({"wrapper.trains_a_nested_model"}), cause="averaged where sum was declared",
        cause_checks=frozenset({"wrapper.trains_a_nested_model"}),
    ),
    "accumulation_drops": Row(
        _fn("accumulation_drops:apply_fsdp", ddp_start="identical"), exit_code=1,
        failing=frozenset({"wrapper.no_sync_accumulates"}), cause=CAUSES["no_sync_lost"],
        cause_checks=frozenset({"wrapper.no_sync_accumulates"}),
    ),
    "stale_reshard": Row(
        _fn("stale_reshard:apply_fsdp", ddp_start="identical"), exit_code=1,
        # Accumulation takes one step, on the first weights: only a second step sees them stale.
        failing=frozenset(
            {"wrapper.trains_like_one_process", "wrapper.world_of_one_trains", "wrapper.trains_a_nested_model"}
        ),
        cause=CAUSES["stale"].split(" (")[0],
    ),
    "torchtitan_mean_declared": Row(
        _fn("torchtitan:apply_fsdp", ddp_start="identical"), exit_code=1, failing=TRAINING,
        cause=CAUSES["sum_for_mean"],
    ),
    "no_start_sync": Row(
        _fn("hsdp:apply_hsdp"), exit_code=1,
        failing=frozenset({"wrapper.identical_start", "wrapper.trains_like_one_process"}),
        cause=CAUSES["no_broadcast"],
    ),
    "hsdp_replicas_apart": Row(
        _fn("replicas_apart:apply_hsdp", ddp_start="identical", ddp_mesh="2x2"), (4,), exit_code=1,
        failing=TRAINING | {"wrapper.ranks_stay_identical"},
        cause="gradients reduced within groups of 2 ranks only (contiguous groups",
    ),
    "divided_twice": Row(
        _fn("divided_twice:apply_fsdp", ddp_start="identical"), exit_code=1, failing=TRAINING, cause=CAUSES["over_w"]
    ),
    "divide_factor_stated": Row(_fn("divide_factor_stated:apply_fsdp", ddp_start="identical")),
    # torch 2.13 divides float64 gradients by the factor twice where a shard group has one rank: named as torch's.
    "divide_factor_stated_hsdp_2x1": Row(
        _fn("divide_factor_stated:apply_fsdp", ddp_start="identical", ddp_mesh="2x1"), (2,), exit_code=1,
        failing=TRAINING, cause="torch's FSDP2 divides float64 gradients by set_gradient_divide_factor's factor (2) "
        "twice where a shard group has one rank",
    ),
    "unsharded_root": Row(
        _fn("unsharded_root:apply_fsdp", ddp_start="identical"), exit_code=1,
        failing=TRAINING | {"wrapper.ranks_stay_identical"},
        cause=CAUSES["plain_never_reduced"].split("{names}")[0],
    ),
}

_REPORTS: dict[str, tuple[Report, str]] = {}


def _report(name: str, world_factory: WorldFactory) -> tuple[Report, str]:
    """The one report of row ``name`` in this process (run on first use: the checks of its components) and its table."""
    if name not in _REPORTS:
        row = GALLERY[name]
        impl, _ = resolve_implementation(ddp_wrapper=parse_wrapper(**row.options))
        validate_implementation(impl)
        components = row.components
        checks = select_checks(load_checks().values(), impl, "all", None, components)
        report = run_checks(checks, impl, row.sizes, max_examples=2, worlds=world_factory, components=components)
        _REPORTS[name] = (report, format_report(report))
    return _REPORTS[name]


def _params(names: Any) -> list[Any]:
    # Every test of one row in one xdist worker, so the row runs once.
    return [pytest.param(n, id=n, marks=pytest.mark.xdist_group(name=f"fsdp_gallery_{n}")) for n in names]


@pytest.mark.parametrize("name", _params(GALLERY))
def test_sharded_wrapper_gets_its_verdict_and_likely_cause(name: str, world_factory: WorldFactory) -> None:
    """Correct sharded wrappers conform; a broken one fails exactly its guarding wrapper checks, naming the bug."""
    row = GALLERY[name]
    report, table = _report(name, world_factory)
    assert report.exit_code() == row.exit_code, table
    failed = {v.check for v in report.verdicts if v.failed and v.tier == "core" and v.check.startswith("wrapper.")}
    assert failed == row.failing, table
    if row.cause is not None:
        caused = [v for v in report.verdicts if v.failed and v.check in row.failing & row.cause_checks]
        assert caused, table
        assert all(row.cause in (v.cause or "") for v in caused), table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.parametrize("name", _params(GALLERY))
def test_no_check_crashes_on_a_dtensor(name: str, world_factory: WorldFactory) -> None:
    """No verdict's message is a DTensor error of the tool's own (mixed tensors, uneven flattening)."""
    report, table = _report(name, world_factory)
    crashes = ("DTensor", "unevenly sharded")
    assert not [v for v in report.verdicts if any(c in v.message for c in crashes)], table


@pytest.mark.parametrize("name", _params(["torchtitan_summed", "hsdp_2x2", "unsharded_root"]))
def test_how_each_parameter_is_sharded_is_noted_under_the_header(name: str, world_factory: WorldFactory) -> None:
    """The header says, per parameter, its placements, mesh dims and local size against its full one (or plain)."""
    _, table = _report(name, world_factory)
    header = table.split("\n\n")[0]
    expected = {
        "torchtitan_summed": "weight: DTensor (Shard(dim=0),) over mesh (dim0=2), local [1, 4] of [2, 4]",
        "hsdp_2x2": "weight: DTensor (Replicate(), Shard(dim=0)) over mesh (dp_replicate=2, dp_shard=2), "
        "local [1, 4] of [2, 4]",
        "unsharded_root": "bias: plain tensor [2]",
    }[name]
    assert expected in header, table


@pytest.mark.parametrize("name", _params(["torchtitan_summed", "hsdp_2x2"]))
def test_a_declared_identical_start_makes_that_check_not_applicable(name: str, world_factory: WorldFactory) -> None:
    """Under --ddp-start identical, wrapper.identical_start is not applicable, saying why."""
    report, table = _report(name, world_factory)
    found = [v for v in report.verdicts if v.check == "wrapper.identical_start" and v.world_size >= 2]
    assert found, table
    assert all(v.outcome == "not applicable" for v in found), table
    assert all("--ddp-start identical declares" in v.message for v in found), table


def test_a_mesh_fitting_no_selected_world_is_a_usage_error() -> None:
    """--ddp-mesh RxS with R*S none of the world sizes stops before any world, naming the option."""
    wrapper = parse_wrapper(ddp_fn="torch.distributed.fsdp:fully_shard", ddp_kwargs=MESH, ddp_mesh="2x2")
    with pytest.raises(OptionError) as raised:
        check_mesh_world_sizes(wrapper, (1, 2, 3), "--world-sizes")
    assert "--ddp-mesh 2x2 makes a mesh of 4 ranks, and no selected world has 4" in raised.value.worded(command_name)
    check_mesh_world_sizes(wrapper, (2, 4), "--world-sizes")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ddp_mesh": "2by2", "ddp_kwargs": MESH}, "--ddp-mesh expects RxS"),
        ({"ddp_mesh": "2x2"}, "shapes the @mesh a --ddp-kwarg passes, and none does"),
        ({"ddp_start": "same"}, "--ddp-start expects one of broadcast, identical"),
        ({"ddp_kwargs": ["mesh=@meshes"]}, "'@meshes' is no symbol; the symbols are @mesh"),
    ],
    ids=["malformed-mesh", "mesh-without-symbol", "unknown-start", "unknown-symbol"],
)
def test_sharding_options_are_checked_before_any_world(options: dict[str, Any], message: str) -> None:
    """A malformed --ddp-mesh or --ddp-start, or an unknown symbol, is an OptionError naming the option."""
    with pytest.raises(OptionError) as raised:
        parse_wrapper(ddp_fn="torch.distributed.fsdp:fully_shard", **options)
    assert message in raised.value.worded(command_name)


def test_worlds_that_cannot_hold_the_mesh_are_not_applicable(world_factory: WorldFactory) -> None:
    """With --ddp-mesh 2x2, a world of 2 ranks runs no wrapper check: each is not applicable, saying why."""
    impl, _ = resolve_implementation(ddp_wrapper=parse_wrapper(**_fn("hsdp:apply_hsdp", ddp_mesh="2x2")))
    checks = [c for c in select_checks(load_checks().values(), impl, "core", None, ("wrapper",))
              if c.name in ("wrapper.trains_like_one_process", "wrapper.identical_start")]
    report = run_checks(checks, impl, (2,), max_examples=1, worlds=world_factory, components=("wrapper",))
    table = format_report(report)
    assert [v.outcome for v in report.verdicts] == ["not applicable"] * 2, table
    assert all("--ddp-mesh 2x2 makes a mesh of 4 ranks; this world has 2 ranks" in v.message
               for v in report.verdicts), table
