"""Layer 2: gloo worlds of 1 and 2 ranks. The gallery of data-parallel wrappers, checked with ``--ddp-fn``.

Each wrapper under ``tests/forks/gallery_ddp_*`` re-expresses one public
pattern (its docstring names it; ``docs/wrappers.md`` has the table).
Each gallery row is run once, through the same option parsing, selection
and runner as ``nemo-dist-conformance --ddp-fn ... --world-sizes 1,2``
(the wrapper checks, every tier), and every test of that row reads its one
report: correct wrappers conform on core, broken ones fail the checks
guarding their bug, each with its likely cause. Beside them: what came back
is noted under the header, the ddp field checks reach a wrapper through
its keywords (or say which keyword it lacks), and a wrapper that needs CUDA
or a launcher's variable is a usage error in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.adapters.wrapping import parse_wrapper
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import OptionError, resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.wrapper.diagnosis import CAUSES
from nemo_dist.testing.plugin import WorldFactory

SIZES = (1, 2)
G = "tests.forks.gallery_ddp_"
#: The check training a model shaped like real ones: its failure names the parameter, not a gradient cause.
NESTED = "wrapper.trains_a_nested_model"
#: The training checks, which a wrong reduction fails.
TRAINING = frozenset({"wrapper.trains_like_one_process", "wrapper.no_sync_accumulates", NESTED})
#: The check reading each reduction's dtype from the backend's collectives.
REDUCE_DTYPE = "wrapper.reduces_in_declared_dtype"
#: The cause a reduction observed below the default --ddp-reduce-dtype (float32) gives.
REDUCED_IN = CAUSES["reduced_in"].replace("{events}", "gloo:all_reduce").replace("{declared}", "float32")


@dataclass(frozen=True)
class Row:
    """One gallery row: the command's options, its core exit status, the core checks failing, their likely cause."""

    options: dict[str, Any]
    exit_code: int = 0
    failing: frozenset[str] = frozenset()
    cause: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    extended: frozenset[str] = frozenset()


def _fn(spec: str, **options: Any) -> dict[str, Any]:
    return {"ddp_fn": G + spec, **options}


#: Row id -> row. Correct wrappers of every shape, then the broken ones.
GALLERY: dict[str, Row] = {
    "detectron2": Row(_fn("detectron2:create_ddp_model"), notes=("returned the model itself (Linear)",)),
    "yolov5": Row(_fn("yolov5:smart_DDP"), notes=("static_graph=True",)),
    "mmengine": Row(_fn("mmengine:MMDistributedDataParallel"), notes=("returned MMDistributedDataParallel",)),
    "fairseq": Row(
        _fn("fairseq:DistributedFairseqModel", ddp_kwargs=["args={'bucket_cap_mb': 25}"]),
        notes=("returned ModuleProxyWrapper, a DistributedDataParallel at .module",),
    ),
    "lightning": Row(_fn("lightning:DDPStrategy", ddp_method="setup_module")),
    "device_strategy": Row(_fn(
        "device_strategy:DDPStrategy",
        ddp_method="setup_module",
        ddp_kwargs=["parallel_devices=@devices", f"cluster_environment={G}device_strategy:LocalEnvironment()"],
    )),
    "colossalai": Row(
        _fn("colossalai:TorchDDPPlugin", ddp_method="configure", ddp_output="0"),
        notes=("returned TorchDDPModel, a DistributedDataParallel at .module",),
    ),
    "replicate": Row(
        _fn("replicate:apply_ddp"),
        notes=("returned None (the model changed in place), a DistributedDataParallel at composable replicate's",),
    ),
    "megatron": Row(
        _fn(
            "megatron:DistributedDataParallel",
            ddp_kwargs=["ddp_config={}"],
            ddp_after_backward="finish_grad_sync",
            ddp_grad_attr="main_grad",
            ddp_zero_grad="zero_grad_buffer",
        ),
        notes=("no DistributedDataParallel inside",),
    ),
    "hand_written": Row(_fn("hand_written:DataParallel")),
    "summed_declared_sum": Row(_fn("summed:DataParallel", ddp_reduction="sum")),
    "torch_ddp_buffers_synced": Row({"ddp_fn": "torch.nn.parallel:DistributedDataParallel", "ddp_buffers": "synced"}),
    "casts_float32": Row(
        _fn("casts_float32:float32_ddp"),
        notes=("the float64 model's parameters became torch.float32",),
        extended=frozenset({"wrapper.keeps_dtype"}),
    ),
    "detectron2_fp16": Row(
        _fn("detectron2:create_ddp_model", ddp_kwargs=["fp16_compression=True"]),
        1,
        TRAINING | {REDUCE_DTYPE},
        REDUCED_IN.format(dtype="float16"),
    ),
    "megatron_unfinished": Row(
        _fn("megatron:DistributedDataParallel", ddp_kwargs=["ddp_config={}"], ddp_grad_attr="main_grad",
            ddp_zero_grad="zero_grad_buffer"),
        1,
        TRAINING | {"wrapper.ranks_stay_identical"},
        CAUSES["never_reduced"],
    ),
    "no_broadcast": Row(
        _fn("no_broadcast:DataParallel"),
        1,
        frozenset({"wrapper.identical_start", "wrapper.trains_like_one_process", "wrapper.ranks_stay_identical"}),
        CAUSES["no_broadcast"],
    ),
    "summed": Row(_fn("summed:DataParallel"), 1, TRAINING, CAUSES["sum_for_mean"]),
    "divided_twice": Row(_fn("divided_twice:DataParallel"), 1, TRAINING, CAUSES["over_w"]),
    "no_sync_drops": Row(
        _fn("no_sync_drops:DataParallel"), 1, frozenset({"wrapper.no_sync_accumulates"}), CAUSES["no_sync_lost"]
    ),
    "no_sync_communicates": Row(
        _fn("no_sync_communicates:DataParallel"), 1, frozenset({"wrapper.no_sync_skips_reduction"})
    ),
    "partial_sync_linear_only": Row(_fn("partial_sync:LinearOnly"), 1, frozenset({NESTED})),
    "partial_sync_root_only": Row(_fn("partial_sync:RootOnly"), 1, frozenset({NESTED})),
    "proxy_drops_kwargs": Row(_fn("proxy_drops_kwargs:Proxy"), 1, frozenset({NESTED})),
    "eval_mode": Row(_fn("eval_mode:eval_ddp"), 1, frozenset({NESTED})),
    "bf16_reduce": Row(
        _fn("bf16_reduce:DataParallel"),
        1,
        TRAINING | {"wrapper.world_of_one_trains", REDUCE_DTYPE},
        REDUCED_IN.format(dtype="bfloat16"),
    ),
    "mmengine_buffers_local": Row(
        _fn("mmengine:MMDistributedDataParallel", ddp_buffers="local"), 1, frozenset({"wrapper.buffers_as_declared"})
    ),
}

_REPORTS: dict[str, tuple[Report, str]] = {}


def _impl(options: dict[str, Any]) -> Any:
    impl, _ = resolve_implementation(ddp_wrapper=parse_wrapper(**options))
    validate_implementation(impl)
    return impl


def _run(options: dict[str, Any], world_factory: WorldFactory, names: tuple[str, ...] = (),
         sizes: tuple[int, ...] = SIZES) -> tuple[Report, str]:
    """The wrapper checks (or the checks ``names``) of ``options``, as the command runs them, in worlds of ``sizes``."""
    impl = _impl(options)
    components = ("ddp", "wrapper") if names else ("wrapper",)
    checks = select_checks(load_checks().values(), impl, "all", None, components)
    if names:
        checks = [c for c in checks if c.name in names]
    report = run_checks(checks, impl, sizes, max_examples=2, worlds=world_factory, components=components)
    return report, format_report(report)


def _report(name: str, world_factory: WorldFactory) -> tuple[Report, str]:
    """The one report of gallery row ``name`` in this process (run on first use) and its table."""
    if name not in _REPORTS:
        _REPORTS[name] = _run(GALLERY[name].options, world_factory)
    return _REPORTS[name]


def _params(names: Any) -> list[Any]:
    # Every test of one row in one xdist worker, so the row runs once.
    return [pytest.param(n, id=n, marks=pytest.mark.xdist_group(name=f"ddp_gallery_{n}")) for n in names]


@pytest.mark.parametrize("name", _params(GALLERY))
def test_gallery_wrapper_gets_its_core_verdict_and_likely_cause(name: str, world_factory: WorldFactory) -> None:
    """Correct wrappers of every shape conform on core; a broken one fails its guarding checks, naming the cause.

    A changed dtype is an extended failure (reported, not blocking); the training checks then compare in it.
    """
    row = GALLERY[name]
    report, table = _report(name, world_factory)
    assert report.exit_code() == row.exit_code, table
    failed = {v.check for v in report.verdicts if v.failed and v.tier == "core"}
    assert failed == row.failing, table
    assert {v.check for v in report.verdicts if v.failed and v.tier == "extended"} == row.extended, table
    if row.cause is not None:
        failures = [v for v in report.verdicts if v.failed and v.tier == "core" and v.check != NESTED]
        assert all(v.cause == row.cause for v in failures), table
        assert f"Likely cause: {row.cause}" in table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.parametrize("name", _params(n for n, row in GALLERY.items() if row.notes))
def test_what_the_wrapper_returned_is_noted_under_the_header(name: str, world_factory: WorldFactory) -> None:
    """The header says what came back and where the DDP was found inside (or that there is none)."""
    _, table = _report(name, world_factory)
    header = table.split("\n\n")[0]
    for note in GALLERY[name].notes:
        assert note in header, table


@pytest.mark.parametrize("name", _params(["hand_written", "replicate", "mmengine_buffers_local"]))
def test_buffers_are_reported_as_found_and_held_to_a_declaration(name: str, world_factory: WorldFactory) -> None:
    """Undeclared, the buffer check says what it found (not applicable); declared, a different finding fails."""
    report, table = _report(name, world_factory)
    (verdict,) = [v for v in report.verdicts if v.check == "wrapper.buffers_as_declared" and v.world_size == 2]
    expected = {
        "hand_written": ("not applicable", "buffers synced at construction only"),
        "replicate": ("not applicable", "buffers local: every rank's forwards saw its own buffers"),
        "mmengine_buffers_local": ("fail", "--ddp-buffers local was declared, but buffers were synced"),
    }[name]
    assert verdict.outcome == expected[0], table
    assert expected[1] in verdict.message, table


@pytest.mark.parametrize("size", [2, 3])
def test_buffers_synced_from_another_rank_than_zero_fail_a_synced_declaration(
    size: int, world_factory: WorldFactory
) -> None:
    """Every rank is judged, rank 0 included: buffers broadcast from the last rank are not "synced"."""
    options = _fn("buffers_from_last_rank:DataParallel", ddp_buffers="synced")
    report, table = _run(options, world_factory, ("wrapper.buffers_as_declared",), (size,))
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail", table
    assert "--ddp-buffers synced was declared, but buffers were neither synced from rank 0 nor local" in verdict.message


#: (row options, ddp checks run in a world of 2, check -> (outcome, text its message holds)).
FIELD_RUNS: dict[str, tuple[dict[str, Any], dict[str, tuple[str, str]]]] = {
    "colossalai": (
        GALLERY["colossalai"].options,
        {
            "ddp.bucket_cap_mb": ("pass", ""),
            "ddp.broadcast_buffers": ("pass", ""),
            "ddp.manager_attributes": ("not applicable", "a --ddp-fn wrapper is no DDPManager"),
            "ddp.activation_checkpointing_full": (
                "not supported",
                "needs activation_checkpointing=: tests.forks.gallery_ddp_colossalai:TorchDDPPlugin(...) takes no "
                "activation_checkpointing= parameter",
            ),
        },
    ),
    # torch's own replicate, as it is: its **kwargs reach the DDP in its state, which drives no module.
    "torch_replicate": (
        {"ddp_fn": "torch.distributed._composable.replicate:replicate"},
        {
            "ddp.bucket_cap_mb": ("not applicable", "no DDP object to compare buckets of"),
            "ddp.broadcast_buffers": ("fail", "broadcast_buffers=True: rank 1's buffer after init is 1, expected 0"),
        },
    ),
    # static_graph through **kwargs: checked on a model checkpointing itself (no activation_checkpointing= to pass).
    "mmengine": (
        GALLERY["mmengine"].options,
        {"ddp.static_graph": ("pass", "")},
    ),
    "drops_static_graph": (
        {"ddp_fn": "tests.forks.gallery_ddp_drops_static_graph:wrap"},
        {"ddp.static_graph": ("fail", "checkpointed: the DDP object's static_graph is False on rank 0, expected True")},
    ),
    "hand_written": (
        GALLERY["hand_written"].options,
        {"ddp.bucket_cap_mb": ("not supported", "takes no bucket_cap_mb= keyword")},
    ),
    # A wrapper registering its own comm hook still has its buckets read (from DDP's reducer) and judged.
    "detectron2_fp16": (
        GALLERY["detectron2_fp16"].options,
        {"ddp.bucket_cap_mb": ("pass", "")},
    ),
    # A wrapper casting the model to float32 is compared in float32's tolerance, not float64's.
    "casts_float32": (
        GALLERY["casts_float32"].options,
        {"ddp.contrastive_loss_equals_full_batch": ("pass", "")},
    ),
}


@pytest.mark.parametrize("name", list(FIELD_RUNS))
def test_ddp_field_checks_reach_a_wrapper_through_its_keywords(name: str, world_factory: WorldFactory) -> None:
    """A field goes to a wrapper taking it (by name or **kwargs) and is checked on the DDP found inside, else named."""
    options, expected = FIELD_RUNS[name]
    report, table = _run(options, world_factory, tuple(expected), (2,))
    got = {v.check: v for v in report.verdicts}
    for check, (outcome, text) in expected.items():
        assert got[check].outcome == outcome, table
        assert text in got[check].message, table


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (_fn("needs_environment:cuda_ddp"),
         "tests.forks.gallery_ddp_needs_environment:cuda_ddp needs CUDA (AssertionError: this trainer runs on CUDA); "
         "run with the nccl backend on a machine with GPUs"),
        (_fn("needs_environment:slurm_ddp"),
         "reads the environment variable SLURM_LOCALID, which this world does not set"),
        (_fn("detectron2:create_ddp_model", ddp_after_backward="finish_grad_sync"),
         "ddp_after_backward finish_grad_sync: what tests.forks.gallery_ddp_detectron2:create_ddp_model returned "
         "(DistributedDataParallel) has no method 'finish_grad_sync'"),
        (_fn("device_strategy:DDPStrategy", ddp_method="setup_module"),
         "tests.forks.gallery_ddp_device_strategy:DDPStrategy().setup_module(model) cannot start: wrapping the model "
         "raised on every rank of a world of 2: AssertionError at "),
        (_fn("device_strategy:DDPStrategy", ddp_method="setup_module", ddp_kwargs=["parallel_devices=@devices"]),
         "assert self.cluster_environment is not None; give what it needs with ddp_kwarg (a Python literal; a "
         "symbol filled on each rank: @device, @devices, @rank, @world_size, @mesh; or MODULE:NAME() for an object "
         "each rank makes)"),
    ],
    ids=["needs-cuda", "needs-launcher-variable", "returned-object-lacks-method", "cannot-start-without-devices",
         "cannot-start-without-environment"],
)
def test_what_only_a_first_call_shows_is_a_usage_error_in_one_line(
    options: dict[str, Any], message: str, world_factory: WorldFactory
) -> None:
    """A wrapper needing CUDA or a launcher's variable, lacking a declared method, or whose wrapping raises (it
    cannot start) stops the run before any check, in one line."""
    with pytest.raises(OptionError) as raised:
        _run(options, world_factory, sizes=(2,))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [
        {"ddp_fn": "torch.nn.parallel:DistributedDataParallel", "ddp_kwargs": ["process_group=@mesh"]},
        _fn("device_strategy:DDPStrategy", ddp_method="setup_module",
            ddp_kwargs=["parallel_devices=@mesh", f"cluster_environment={G}device_strategy:LocalEnvironment()"]),
    ],
    ids=["ddp-process-group", "strategy-parallel-devices"],
)
def test_mesh_is_filled_as_the_process_group_or_device_list_a_wrapper_wants(
    options: dict[str, Any], world_factory: WorldFactory
) -> None:
    """@mesh passed to DDP's process_group is the mesh's group, to a strategy's parallel_devices the devices: both
    wrappers start and train as one process on the full batch."""
    names = ("wrapper.trains_like_one_process", "wrapper.ranks_stay_identical")
    report, table = _run(options, world_factory, names, (2,))
    assert [v.outcome for v in report.verdicts] == ["pass", "pass"], table

