"""Conformance checks of the DDP entry points: every ``DDPConfig`` field proven by behaviour.

Each check builds small seeded float64 models on every rank of a world
(:mod:`.ranks`, :mod:`.training`, :mod:`.op_ranks`), wraps them through the
implementation's entry point (``parallelize_ddp`` and ``DDPManager``: each one
the module defines gets its own run) and asserts in the parent on what the
ranks report: buffers equalised or left alone, the bucket layout equal to
torch's own DDP's for the same cap, an unused parameter tolerated as torch's
own DDP tolerates it or raising, gradients aliasing the bucket storage,
static graph accepted, blocks recomputed in backward under checkpointing
(every matmul under full; under selective at least one op and fewer than
full, whichever its policy saves; none without it) with unchanged
gradients, autocast running the matmuls in its dtype with
float32 parameters and gradients equal to an explicit ``torch.autocast``, and
training equal to one process on the full batch. Each field's off or default
value is checked beside its other values.

Core is what upstream (nemo-automodel 0.7.0) does. Upstream returns the
model unwrapped in a world of one rank, so a check that needs the DDP object
is not applicable there; wrapping a world of one, applying
``autocast_dtype`` and leaving the dtype alone are extended.

The checks run in gloo worlds (models on CPU) and in NCCL worlds (the
manager moves each rank's model to its GPU; inputs and the single-process
reference copies follow it there, results come back on CPU).  Tolerances are
the same on both: the models are float64 (TF32 never applies to float64) or
run under bf16 autocast, whose tolerance covers either device.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nemo_dist.conformance.engine.errors import ChosenByCode, NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check
from nemo_dist.conformance.suites.ddp import op_ranks, ranks, recompute, training
from nemo_dist.conformance.suites.ddp.configs import ddp_configs
from nemo_dist.conformance.suites.ddp.entry_point import NotDDP, resolved_api
from nemo_dist.conformance.suites.ddp.expectations import (
    TOLERANCE_BF16,
    TOLERANCE_FLOAT64,
    TOLERANCE_TIGHT,
    assert_autocast_grads,
    assert_close_lists,
    assert_device_placement,
    assert_ranks_identical,
    tolerance_for,
)
from nemo_dist.conformance.suites.ddp.messages import (
    AutocastOps,
    BucketLayout,
    BufferSync,
    ConfigRun,
    ContrastiveRun,
    ManagerAttributes,
    Placement,
    StaticRun,
    UnusedParameter,
)
from nemo_dist.conformance.suites.ddp.ops import require_seen

__all__ = [
    "activation_checkpointing_full",
    "activation_checkpointing_off",
    "activation_checkpointing_selective",
    "any_config_trains_like_one_process",
    "autocast_dtype",
    "broadcast_buffers",
    "bucket_cap_mb",
    "contrastive_loss_equals_full_batch",
    "find_unused_parameters",
    "gradient_as_bucket_view",
    "manager_attributes",
    "parallelize_wraps_and_places",
    "requires_process_group",
    "selective_checkpointing_saves_matmuls",
    "static_graph",
    "world_of_one_wrapped_in_ddp",
]

def _global_batch(seed: int, rows: int, dim: int = 8) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator, dtype=torch.float64)


def _examples(divisor: int) -> int:
    return max(3, settings().max_examples // divisor)


_BASIC_CONFIGS: list[dict[str, Any]] = [
    {},
    {
        "activation_checkpointing": "selective",
        "activation_checkpointing_scope": "language+vision",
        "broadcast_buffers": True,
        "find_unused_parameters": True,
        "bucket_cap_mb": 1.0,
        "gradient_as_bucket_view": True,
    },
    {"activation_checkpointing": True, "static_graph": True},
]


def _not_a_ddp(world: WorldLike, returned: str, what: str, impl: Implementation) -> NoReturn:
    """Raise: not applicable in a world of one (upstream returns the model there) or for a wrapper, else a failure."""
    if impl.ddp_wrapper is not None:
        raise ChosenByCode(
            f"{impl.ddp_wrapper.fn} returned {returned}, with no DistributedDataParallel driving the model inside "
            f"(itself, at .module): no DDP object to {what}"
        )
    if world.size == 1:
        raise ChosenByCode(
            f"the entry point returned {returned}, not DistributedDataParallel, in a world of one rank "
            f"(as upstream does): no DDP object to {what}"
        )
    raise AssertionError(
        f"the entry point returned {returned}, not DistributedDataParallel, in a world of {world.size}"
    )


@check("ddp.requires_process_group", tier="core", component="ddp", needs_world=False)
def requires_process_group(world: None, impl: Implementation) -> None:
    """Without a process group, the entry point raises RuntimeError."""
    import unittest

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise unittest.SkipTest("this process is a rank of a world (torchrun); the check needs one without a group")
    raised = ranks.requires_process_group(impl)
    assert raised == "RuntimeError", (
        f"{resolved_api(impl)} without an initialised process group "
        + ("raised nothing" if raised is None else f"raised {raised}")
        + "; expected RuntimeError"
    )


@check("ddp.manager_attributes", tier="core", component="ddp", variants=("DDPManager",))
def manager_attributes(world: WorldLike, impl: Implementation) -> None:
    """DDPManager sets rank, world_size and device (its GPU under NCCL) and mirrors every config field."""
    for config in _BASIC_CONFIGS:
        results: list[ManagerAttributes] = world.run(ranks.manager_attributes, impl, config)
        for rank, got in enumerate(results):
            assert got.rank == (rank, rank), (
                f"config {config}: manager.rank, dist rank = {got.rank}, expected {rank}"
            )
            assert got.world_size == (world.size, world.size), (
                f"config {config}: manager.world_size, dist world size = {got.world_size}, expected {world.size}"
            )
            for field, (mirrored, configured) in got.mirrored.items():
                assert mirrored == configured, (
                    f"config {config}: manager.{field} is {mirrored!r}, the config's {field} is {configured!r}"
                )
            cuda = got.current_device is not None
            expected = f"cuda:{got.current_device}" if cuda else "cpu"
            assert got.device == expected, f"config {config}: manager.device is {got.device}, expected {expected}"


@check("ddp.parallelize_wraps_and_places", tier="core", component="ddp")
def parallelize_wraps_and_places(world: WorldLike, impl: Implementation) -> None:
    """The entry point returns DDP over the model (or, in a world of one, may return the model) on the rank's device."""
    for config in _BASIC_CONFIGS:
        results: list[Placement] = world.run(ranks.placement, impl, config)
        for rank, got in enumerate(results):
            what = f"config {config}, rank {rank}"
            if world.size > 1 or not got.is_model:
                assert got.is_ddp, f"{what}: the entry point returned {got.returned}, not DistributedDataParallel"
                assert got.module_is_model, f"{what}: the DDP's .module is not the model passed in"
            assert_device_placement(got, rank, what)


@check("ddp.world_of_one_wrapped_in_ddp", tier="extended", component="ddp", max_world=1)
def world_of_one_wrapped_in_ddp(world: WorldLike, impl: Implementation) -> None:
    """In a world of one rank the model is still wrapped in DDP, and its dtype is left as it is."""
    for config in _BASIC_CONFIGS:
        got: Placement
        (got,) = world.run(ranks.placement, impl, config)
        assert got.is_ddp, (
            f"config {config}: in a world of one the entry point returned {got.returned}, "
            "not DistributedDataParallel"
        )
        assert got.param_dtypes == ["torch.float64"], (
            f"config {config}: a float64 model came back with parameters of {got.param_dtypes}"
        )


@check("ddp.broadcast_buffers", tier="core", component="ddp", min_world=2)
def broadcast_buffers(world: WorldLike, impl: Implementation) -> None:
    """broadcast_buffers=True gives every rank rank 0's buffers; False leaves them rank-local, also at construction."""
    dim = 8
    for enabled in (True, False):
        results: list[BufferSync] = world.run(ranks.buffer_sync, impl, enabled)
        for rank, got in enumerate(results):
            source = 0 if enabled else rank
            expected = [
                ("after_init", got.after_init, [float(source)] * dim),
                ("forward1", got.forward1, [float(source)] * dim),
                ("forward2", got.forward2, [float(source + 10)] * dim),
            ]
            for stage, seen, value in expected:
                assert seen == value, (
                    f"broadcast_buffers={enabled}: rank {rank}'s buffer {stage.replace('_', ' ')} is "
                    f"{seen[0]:g}, expected {value[0]:g} ("
                    + ("rank 0's buffer" if enabled else "its own buffer: no sync at construction or forward")
                    + ")"
                )


#: The first cap checked: 8 buckets of three 2 KiB parameters on the bucket model (DDP closes a bucket once it
#: reaches the cap). The caps drawn go from 0.001 MiB (a bucket per parameter) to 100 MiB, a decade per 10 steps.
FIRST_BUCKET_CAP = 0.004


def _bucket_cap(step: int) -> float:
    """Cap number ``step`` of 0-50: ``0.001 * 10 ** (step / 10)`` MiB, to three significant digits."""
    return float(f"{0.001 * 10 ** (step / 10):.3g}")


def _assert_torch_layout(world: WorldLike, impl: Implementation, cap: float | None) -> None:
    results: list[dict[str, BucketLayout] | NotDDP] = world.run(ranks.bucket_layouts, impl, [cap], 2)
    for rank, layouts in enumerate(results):
        if isinstance(layouts, NotDDP):
            _not_a_ddp(world, layouts.returned, "compare buckets of", impl)
        found = layouts[repr(cap)]
        got, expected = found.got, found.torch_ddp
        torch_ddp = "torch's DistributedDataParallel" + ("" if cap is None else f"(bucket_cap_mb={cap})")
        assert got == expected, (
            f"bucket_cap_mb={cap}: rank {rank}'s DDP gave {len(got)} bucket(s), {torch_ddp} gives "
            f"{len(expected)} on the same model (24 float64 parameters of 2 KiB); is the cap forwarded to DDP, "
            f"in MiB? Parameter indices by bucket on step 2: {got}, torch's: {expected}"
        )
        assert found.got_cap_bytes == found.torch_cap_bytes, (
            f"bucket_cap_mb={cap}: rank {rank}'s DDP has a bucket cap of {found.got_cap_bytes} bytes, {torch_ddp} "
            f"has {found.torch_cap_bytes}"
            + (" (torch's default)" if cap is None else "")
            + "; is the cap forwarded to DDP as given, in MiB?"
        )


@check("ddp.bucket_cap_mb", tier="core", component="ddp")
def bucket_cap_mb(world: WorldLike, impl: Implementation) -> None:
    """bucket_cap_mb gives torch DDP's own buckets and cap, for caps from 0.001 to 100 MiB; None, its default."""
    # A cap first: where the entry point cannot take the field, that is what the verdict says.
    _assert_torch_layout(world, impl, FIRST_BUCKET_CAP)
    _assert_torch_layout(world, impl, None)

    @settings(max_examples=_examples(4))
    @example(step=0)  # 0.001 MiB: a bucket per parameter
    @example(step=50)  # 100 MiB
    @given(step=st.integers(0, 50))
    def drawn_cap(step: int) -> None:
        _assert_torch_layout(world, impl, _bucket_cap(step))

    drawn_cap()


@check("ddp.find_unused_parameters", tier="core", component="ddp")
def find_unused_parameters(world: WorldLike, impl: Implementation) -> None:
    """A skipped parameter trains as torch's DDP trains it with find_unused_parameters=True, and raises with False."""
    results: list[UnusedParameter | NotDDP] = world.run(ranks.unused_parameter, impl, True)
    for got in results:
        if isinstance(got, NotDDP):
            _not_a_ddp(world, got.returned, "raise or tolerate an unused parameter", impl)
    tolerated = [got for got in results if not isinstance(got, NotDDP)]  # every one: _not_a_ddp raised otherwise
    for rank, ran in enumerate(tolerated):
        assert ran.error is None, f"find_unused_parameters=True: rank {rank} raised: {ran.error}"
        assert_close_lists(
            ran.params,
            ran.torch_ddp.params,
            f"find_unused_parameters=True, rank {rank}: parameters vs torch's DDP with the same flag",
            TOLERANCE_TIGHT,
        )
    assert_ranks_identical([ran.params for ran in tolerated], "find_unused_parameters=True")
    refused: list[UnusedParameter] = world.run(ranks.unused_parameter, impl, False)
    for rank, ran in enumerate(refused):
        assert ran.error is not None, (
            f"find_unused_parameters=False: rank {rank} trained two iterations with an unused parameter; "
            "DDP should have raised (is the flag forwarded?)"
        )
        assert "unused" in ran.error or "finished reduction" in ran.error, (
            f"find_unused_parameters=False: rank {rank} raised something else: {ran.error[:300]}"
        )


@check("ddp.gradient_as_bucket_view", tier="core", component="ddp")
def gradient_as_bucket_view(world: WorldLike, impl: Implementation) -> None:
    """gradient_as_bucket_view=True makes every param.grad live in a DDP bucket buffer; False in none."""
    for enabled in (True, False):
        for rank, steps in enumerate(world.run(ranks.grad_bucket_aliasing, impl, enabled, 3)):
            if isinstance(steps, NotDDP):
                _not_a_ddp(world, steps.returned, "hold bucket views", impl)
            for step, inside in enumerate(steps, start=1):
                assert all(v == enabled for v in inside), (
                    f"gradient_as_bucket_view={enabled}: on rank {rank}, step {step}, param.grad inside a "
                    f"bucket buffer per parameter: {inside}; expected all {enabled}"
                )


@check("ddp.static_graph", tier="core", component="ddp")
def static_graph(world: WorldLike, impl: Implementation) -> None:
    """static_graph=True is recorded by DDP (False by default), accepts checkpointing and an unused parameter."""
    global_x = _global_batch(11, 2 * world.size)
    results: list[dict[str, StaticRun] | NotDDP] = world.run(training.static_graph_training, impl, global_x, 3)
    for runs in results:
        if isinstance(runs, NotDDP):
            _not_a_ddp(world, runs.returned, "record static_graph", impl)
    ranks_runs = [runs for runs in results if not isinstance(runs, NotDDP)]  # every one: _not_a_ddp raised otherwise
    for rank, by_setting in enumerate(ranks_runs):
        for setting, run in by_setting.items():
            assert run.static_graph is True, (
                f"{setting}: the DDP object's static_graph is {run.static_graph!r} on rank {rank}, expected True"
            )
            assert run.default_static_graph is False, (
                f"{setting}: with static_graph=False the DDP object's static_graph is "
                f"{run.default_static_graph!r} on rank {rank}, expected False"
            )
            assert run.error is None, (
                f"{setting}: training with static_graph=True raised on rank {rank}: {run.error[:300]}"
            )
            assert_close_lists(
                run.static, run.dynamic, f"{setting}, rank {rank}: static vs dynamic graph", TOLERANCE_TIGHT
            )
    for setting in ranks_runs[0]:
        assert_ranks_identical([runs[setting].static for runs in ranks_runs], f"static_graph ({setting})")


@check("ddp.activation_checkpointing_full", tier="core", component="ddp", sampled=True)
def activation_checkpointing_full(world: WorldLike, impl: Implementation) -> None:
    """Full checkpointing recomputes every matmul of exactly the selected trainable blocks, gradients unchanged."""
    recompute.check_recompute(world, impl, True)
    recompute.check_recompute(world, impl, "full", ("all", "language"), "language")  # the same mode, as a string


@check("ddp.activation_checkpointing_off", tier="core", component="ddp", sampled=True)
def activation_checkpointing_off(world: WorldLike, impl: Implementation) -> None:
    """activation_checkpointing=False (the default) recomputes no block, no matmul in backward, whatever the scope."""
    recompute.check_recompute(world, impl, False, ("all", "multimodal"), "all")


@check("ddp.activation_checkpointing_selective", tier="core", component="ddp", sampled=True)
def activation_checkpointing_selective(world: WorldLike, impl: Implementation) -> None:
    """Selective checkpointing reruns exactly the selected trainable blocks, each recomputing at least one op and
    strictly fewer than full checkpointing (whichever ops its policy saves); same grads."""
    recompute.check_recompute(world, impl, "selective")


@check("ddp.selective_checkpointing_saves_matmuls", tier="extended", component="ddp", sampled=True)
def selective_checkpointing_saves_matmuls(world: WorldLike, impl: Implementation) -> None:
    """Selective checkpointing's selected blocks run fewer matmuls again than forward: a matmul output saved, as
    torch's documented policy and upstream's save them."""
    recompute.check_saves_a_matmul(world, impl)


@check("ddp.autocast_dtype", tier="extended", component="ddp")
def autocast_dtype(world: WorldLike, impl: Implementation) -> None:
    """autocast_dtype: matmuls in bf16/fp16 (a checkpointed block's recompute too), the output's dtype, parameters and
    grads float32 and as torch.autocast's; None: all float32."""
    global_x = _global_batch(13, 2 * world.size).float()
    for dtype in (torch.bfloat16, torch.float16, None):
        ran = str(dtype or torch.float32)
        results: list[AutocastOps] = world.run(op_ranks.autocast_ops, impl, dtype, global_x)
        for rank, got in enumerate(results):
            what = f"autocast_dtype={dtype}, rank {rank}"
            assert got.params == ["torch.float32"], (
                f"{what}: a float32 model's parameters are {got.params} after wrapping; autocast leaves them float32"
            )
            require_seen(got.matmuls, f"{what}: the op recorder saw no matmul of the wrapped forward")
            assert set(got.matmuls) == {ran}, (
                f"{what}: the forward's matmuls ran in {sorted(set(got.matmuls))}, expected {ran} "
                f"(the output is {got.output})"
            )
            assert got.output == got.reference_output, (
                f"{what}: the wrapped forward returned {got.output}, torch.autocast's forward of the same model "
                f"returns {got.reference_output} (is the output cast, or the forward run outside autocast?)"
            )
            stray = [op for op in got.floating if not op.endswith(ran)] if dtype is None else []
            assert not stray, f"{what}: ops of the forward computed in other dtypes than float32: {stray}"
            assert got.grad_dtypes == ["torch.float32"], f"{what}: gradients are {got.grad_dtypes}, not float32"
            assert_autocast_grads(got, what, dtype)
    for mode in (True, "selective"):  # a checkpointed block's recompute must run under autocast too
        checkpointed: list[AutocastOps] = world.run(op_ranks.autocast_ops, impl, torch.bfloat16, global_x, mode)
        for rank, got in enumerate(checkpointed):
            what = f"autocast_dtype=torch.bfloat16 with activation_checkpointing={mode!r}, rank {rank}"
            seen = sorted(set(got.matmuls) | set(got.backward_matmuls))
            require_seen(got.backward_matmuls, f"{what}: the op recorder saw no matmul of the backward")
            assert seen == ["torch.bfloat16"], (
                f"{what}: matmuls ran in {seen} in forward and backward, expected torch.bfloat16 only (is the "
                "checkpointed forward recomputed outside autocast?)"
            )
            assert_autocast_grads(got, what, torch.bfloat16)


@check("ddp.contrastive_loss_equals_full_batch", tier="core", component="ddp")
def contrastive_loss_equals_full_batch(world: WorldLike, impl: Implementation) -> None:
    """A gathered InfoNCE loss under DDP gives the single-process full-batch gradient; ranks stay bit-identical."""
    declared = None if impl.ddp_wrapper is None else impl.ddp_wrapper.compute_dtype
    if declared not in (None, "float64"):
        raise NotApplicable(
            f"--ddp-compute-dtype {declared}: the contrastive loss's gradients cancel to values far below the "
            f"terms they sum, so {declared}'s rounding of those terms can exceed them; the wrapper.* training "
            "checks judge the wrapper in that dtype"
        )

    @settings(max_examples=_examples(5))
    @given(seed=st.integers(0, 2**16), rows=st.integers(1, 3), dim=st.integers(1, 6))
    def example(seed: int, rows: int, dim: int) -> None:
        n = rows * world.size
        x = _global_batch(seed, n, dim)
        y = x + 0.1 * _global_batch(seed + 1, n, dim)
        results: list[ContrastiveRun] = world.run(training.contrastive_identity, impl, x, y, 3, 0.1, 0.5)
        for rank, got in enumerate(results):
            what = f"rank {rank}: step-1 gradient vs full batch"
            tolerance = tolerance_for(got.dtype, TOLERANCE_TIGHT)
            assert_close_lists(got.ddp, got.reference, what, tolerance)
            what = f"rank {rank}: parameters after 3 steps vs full batch"
            assert_close_lists(got.params, got.reference_params, what, tolerance)
        assert_ranks_identical([got.params for got in results], "contrastive training")

    example()


@check("ddp.any_config_trains_like_one_process", tier="core", component="ddp")
def any_config_trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """For any valid DDPConfig (autocast aside), DDP training equals one process on the full batch; ranks agree."""

    # autocast_dtype is extended (upstream does not apply it): the core property draws the other fields.
    @settings(max_examples=_examples(4))
    @given(config=ddp_configs(autocast_dtype=None), seed=st.integers(0, 2**16), rows=st.integers(1, 3))
    def example(config: dict[str, Any], seed: int, rows: int) -> None:
        global_x = _global_batch(seed, rows * world.size)
        results: list[ConfigRun] = world.run(training.train_config, impl, config, global_x, 2)
        for rank, got in enumerate(results):
            tolerance = TOLERANCE_FLOAT64 if config.get("autocast_dtype") is None else TOLERANCE_BF16
            tolerance = tolerance_for(got.dtype, tolerance)
            assert_close_lists(
                got.params, got.reference, f"config {config}, rank {rank}: DDP vs full batch", tolerance
            )
        assert_ranks_identical([got.params for got in results], f"config {config}")

    example()
