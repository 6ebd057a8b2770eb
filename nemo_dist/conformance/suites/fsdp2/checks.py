"""Conformance checks of the FSDP2 component: every ``FSDP2Config`` field proven by behaviour in real worlds.

Each check shards a seeded :class:`~nemo_dist.conformance.suites.fsdp2.models.TinyLM`
through the component's entry point over NeMo AutoModel's mesh, on every rank
(:mod:`.ranks`), and asserts in the parent on what the ranks report. FSDP
is ``(1, W)`` replicas x shards; HSDP is ``(2, W/2)``, in worlds of 4 or
more ranks of even size: the sharding check checks both there, the training
checks HSDP (:func:`richest`). Checks of a field's mechanics that do not
depend on the world's size (the policies' dtypes, deferred sync, prefetch
chains, resharding, offload, checkpointing) run once per run, in its
smallest world of two or more ranks (in the richest layout there). Mixed
precision is off (an explicit ``MixedPrecisionPolicy()``) wherever the check
is not about it, so float64 training compares with one process on the full
batch within reduction order. ``FSDP2Config`` itself (defaults, validation)
is checked by :mod:`.config_checks`.

Core is what upstream (nemo-automodel 0.7.0) does, its quirks included:

- ``mp_policy=None`` is bf16 compute with a float32 reduction, no
  output cast and no input cast;
- in a world of one rank nothing is sharded and nothing is cast (the model
  comes back as it was);
- the root unit never reshards after forward; with
  ``reshard_after_forward=None`` every layer but the last reshards, the
  input embedding reshards, the output head does not;
- ``enable_fsdp2_prefetch`` defaults to False in the config (its docstring
  says True).
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.ddp.checkpoint_rules import explained, judge_block, raise_unobserved
from nemo_dist.conformance.suites.ddp.expectations import TOLERANCE_FLOAT64, TOLERANCE_TIGHT, assert_close_lists
from nemo_dist.conformance.suites.fsdp2 import ranks
from nemo_dist.conformance.suites.fsdp2.causes import fsdp2_check
from nemo_dist.conformance.suites.fsdp2.messages import (
    Accumulation,
    Checkpointing,
    Dtypes,
    FunctionalLayout,
    Offload,
    Sharding,
    StateDicts,
    Trained,
)
from nemo_dist.conformance.suites.fsdp2.upstream import prefetch_chains, reshard_expected

__all__ = [
    "activation_checkpointing_recomputes_selected_layers",
    "cpu_offload_trains_and_offloads",
    "default_mp_policy_bf16_compute_fp32_reduce",
    "deferred_sync_reduces_on_the_last_micro_batch",
    "functional_entry_point_keeps_upstream_defaults",
    "mp_policy_fields_apply",
    "prefetch_chains_have_configured_depth",
    "reshard_after_forward_chooses_units",
    "shards_over_the_data_parallel_dims",
    "state_dict_round_trips",
    "tied_embeddings_stay_tied",
    "trains_like_one_process",
    "world_of_one_shards_nothing",
]

_SEED = 7


def layouts(size: int) -> list[int]:
    """Replica counts checked in a world of ``size``: FSDP (1), and HSDP (2) where 2 x 2 or more fits evenly."""
    return [1, 2] if size >= 4 and size % 2 == 0 else [1]


def richest(size: int) -> list[int]:
    """The one layout a costly check trains in, in a world of ``size``: HSDP where it fits, else FSDP.

    A world of 4 ranks on a small machine trains slowly (its ranks share the
    cores), and FSDP training is already proven in the smaller worlds of the
    run; its sharding over 4 ranks is proven by
    :func:`shards_over_the_data_parallel_dims`, which checks every layout.
    """
    return layouts(size)[-1:]


def _layout_name(replicas: int, size: int) -> str:
    return "FSDP" if replicas == 1 else f"HSDP {replicas}x{size // replicas}"


def _chunk_rows(rows: int, shards: int, index: int) -> int:
    """Rows of shard ``index`` when ``rows`` are split as ``torch.chunk`` splits them (what FSDP2 keeps locally)."""
    size = -(-rows // shards)
    return max(0, min(size, rows - index * size))


@fsdp2_check("fsdp2.shards_over_the_data_parallel_dims")
def shards_over_the_data_parallel_dims(world: WorldLike, impl: Implementation) -> None:
    """Every parameter a DTensor: Shard(0) over the shard group (HSDP: Replicate over replicas), its chunk, whole."""
    for replicas in layouts(world.size):
        layout = _layout_name(replicas, world.size)
        results: list[Sharding] = world.run(ranks.sharding, impl, replicas, _SEED)
        for rank, found in enumerate(results):
            groups = found.expected
            placements = ["Shard(dim=0)"] if replicas == 1 else ["Replicate()", "Shard(dim=0)"]
            expected_groups = [groups.shard] if replicas == 1 else [groups.replicate, groups.shard]
            index = groups.shard.index(rank)
            for param in found.params:
                where = f"{layout}, rank {rank}: {param.name}"
                placed = param.placed
                assert placed is not None, f"{where} is not sharded (a plain tensor, not a DTensor)"
                assert placed.placements == placements, (
                    f"{where} has placements {placed.placements}, expected {placements}"
                )
                assert placed.groups == expected_groups, (
                    f"{where} is placed over ranks {placed.groups} (mesh dims {placed.dims}), expected "
                    f"{expected_groups}: "
                    + ("the shard group" if replicas == 1 else "the replica group, then the shard group")
                )
                rows = _chunk_rows(param.rows, len(groups.shard), index)
                assert placed.local_rows == rows, (
                    f"{where} holds {placed.local_rows} of {param.rows} rows locally, expected {rows} "
                    f"(shard {index} of {len(groups.shard)}, split as torch.chunk)"
                )
                assert param.full_equal, f"{where}: its full tensor differs from the unsharded model's"


@fsdp2_check("fsdp2.world_of_one_shards_nothing", min_world=1, max_world=1)
def world_of_one_shards_nothing(world: WorldLike, impl: Implementation) -> None:
    """In a world of one rank the model comes back itself, unsharded, and the default policy casts nothing."""
    found: Sharding
    (found,) = world.run(ranks.sharding, impl, 1, _SEED)
    assert found.returned_model, "the entry point returned another object than the model"
    sharded = [p.name for p in found.params if p.placed is not None]
    assert not sharded, f"parameters {sharded} were sharded in a world of one rank (upstream shards nothing there)"
    dtypes: Dtypes
    (dtypes,) = world.run(ranks.precision, impl, 1, _SEED, None)
    assert (dtypes.compute, dtypes.output) == ("float32", "float32"), (
        f"the default mp_policy in a world of one computed in {dtypes.compute} with {dtypes.output} output; "
        "expected the model's float32 (nothing is cast where nothing is sharded)"
    )


def _assert_trained(
    world: WorldLike,
    impl: Implementation,
    what: str,
    fields: dict[str, Any],
    tied: bool,
    optimizers: tuple[str, ...] = ("sgd", "adam"),
) -> None:
    for replicas in richest(world.size):
        for optimizer in optimizers:
            label = f"{what}, {_layout_name(replicas, world.size)}, {optimizer}, 3 steps"
            results: list[Trained] = world.run(ranks.training, impl, replicas, _SEED, optimizer, 3, fields, tied)
            for rank, found in enumerate(results):
                if tied:
                    assert found.tied, f"{label}, rank {rank}: head.weight is no longer embed.weight"
                assert_close_lists(
                    found.params,
                    found.expected,
                    f"{label}, rank {rank}: parameters vs one process on the whole batch",
                    TOLERANCE_FLOAT64,
                )
                assert not found.replicas_differ, (
                    f"{label}, rank {rank}: its shards of {found.replicas_differ} differ from another replica's "
                    "(the ranks its placement replicates over must stay bit-identical: is the gradient reduced "
                    "across replicas?)"
                )


@fsdp2_check("fsdp2.trains_like_one_process", min_world=1)
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """SGD and Adam steps equal one process on the whole batch (the mean over every rank); HSDP replicas identical."""
    _assert_trained(world, impl, "mixed precision off", {}, tied=False)


@fsdp2_check("fsdp2.tied_embeddings_stay_tied", min_world=1)
def tied_embeddings_stay_tied(world: WorldLike, impl: Implementation) -> None:
    """A head tied to the input embedding stays one parameter and trains like one process, shards uneven or not;
    where it shards, a tied head inside a layer list is refused (ValueError on every rank), as upstream refuses it."""
    _assert_trained(world, impl, "tied embeddings", {}, tied=True, optimizers=("sgd",))
    if world.size > 1:
        raised = world.run(ranks.tied_in_a_layer_list, impl, _SEED)
        assert raised == ["ValueError"] * world.size, (
            f"a tied head that is also an entry of the layer list (two units would own one weight): ranks raised "
            f"{raised}, expected ValueError on every rank"
        )


def _seen(*, compute: str, layer_input: str, output: str, reduce: str) -> dict[str, Any]:
    """What a rank of :func:`~.ranks.precision` must see; sharded parameters, gradients and Adam state stay float32."""
    sharded = ["float32"]
    return {
        "compute": compute,
        "layer_input": layer_input,
        "output": output,
        "params": sharded,
        "grads": sharded,
        "state": sharded,
        "reduce": reduce,
    }


def _assert_dtypes(found: Dtypes, expected: dict[str, Any], where: str) -> bool:
    """Assert every dtype a rank saw (``found``) is the ``expected`` one; whether the reductions' dtype was read.

    The reduction's dtype comes from the profiler's record of the backend's
    collectives; where it recorded none with a dtype (a backend whose events
    carry no shapes), only the other dtypes are judged and False is returned.
    """
    seen = {"compute": found.compute, "layer_input": found.layer_input, "output": found.output,
            "params": found.params, "grads": found.grads, "state": found.state}
    for key, value in expected.items():
        if key == "reduce":
            continue
        assert seen[key] == value, f"{where}: {key} dtype(s) {seen[key]}, expected {value}"
    typed = [(event, dtype) for event, dtype in found.reductions if dtype]
    if not typed:
        return False
    reduced = sorted({dtype for _, dtype in typed})
    assert reduced == [expected["reduce"]], (
        f"{where}: gradients reduced in {', '.join(reduced)} ({typed[0][0]}), expected {expected['reduce']}"
    )
    return True


def _reductions_unread(read: list[bool]) -> None:
    """Raise ``NotApplicable`` when no rank's reductions had a recorded dtype (every other dtype held)."""
    if not any(read):
        raise NotApplicable(
            "the profiler recorded no dtype of the backend's gradient reductions here, so the reduce dtype was not "
            "judged; every other dtype (compute, output, parameters, gradients, optimizer state) held"
        )


@fsdp2_check("fsdp2.default_mp_policy_bf16_compute_fp32_reduce", once=True)
def default_mp_policy_bf16_compute_fp32_reduce(world: WorldLike, impl: Implementation) -> None:
    """mp_policy=None computes in bfloat16 and reduces in float32; parameters, grads and Adam state stay float32."""
    expected = _seen(compute="bfloat16", layer_input="bfloat16", output="bfloat16", reduce="float32")
    read = []
    for replicas in richest(world.size):
        for rank, found in enumerate(world.run(ranks.precision, impl, replicas, _SEED, None)):
            where = f"mp_policy=None, {_layout_name(replicas, world.size)}, rank {rank}"
            read.append(_assert_dtypes(found, expected, where))
    _reductions_unread(read)


#: (policy fields, what each rank must see): compute, a layer's input inside its unit, output, sharded parameters,
#: gradients, Adam state, reduction. With output_dtype float32 the embedding unit hands float32 to the first layer,
#: whose unit casts it to bfloat16 (cast_forward_inputs, True unless said).
_POLICIES: list[tuple[dict[str, str], dict[str, Any]]] = [
    (
        {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "float32"},
        _seen(compute="bfloat16", layer_input="bfloat16", output="float32", reduce="float32"),
    ),
    (
        {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"},
        _seen(compute="bfloat16", layer_input="bfloat16", output="bfloat16", reduce="bfloat16"),
    ),
    ({}, _seen(compute="float32", layer_input="float32", output="float32", reduce="float32")),
]


@fsdp2_check("fsdp2.mp_policy_fields_apply", once=True)
def mp_policy_fields_apply(world: WorldLike, impl: Implementation) -> None:
    """An explicit MixedPrecisionPolicy's param, reduce and output dtypes apply; sharded state keeps its own dtype."""
    read = []
    for policy, expected in _POLICIES:
        for rank, found in enumerate(world.run(ranks.precision, impl, 1, _SEED, policy)):
            read.append(_assert_dtypes(found, expected, f"mp_policy=MixedPrecisionPolicy({policy}), rank {rank}"))
    _reductions_unread(read)


@fsdp2_check("fsdp2.state_dict_round_trips")
def state_dict_round_trips(world: WorldLike, impl: Implementation) -> None:
    """The full state dict has the unsharded model's keys and values; a sharded one loads into another sharded model."""
    for replicas in richest(world.size):
        layout = _layout_name(replicas, world.size)
        results: list[StateDicts] = world.run(ranks.state_dicts, impl, replicas, _SEED)
        for rank, found in enumerate(results):
            where = f"{layout}, rank {rank}"
            assert found.keys == found.expected_keys, (
                f"{where}: the full state dict's keys {found.keys} differ from the unsharded model's "
                f"{found.expected_keys}"
            )
            assert_close_lists(
                [found.whole[name] for name in found.first],
                list(found.first.values()),
                f"{where}: full state dict vs the trained parameters",
                TOLERANCE_TIGHT,
            )
            assert_close_lists(
                list(found.second.values()),
                list(found.first.values()),
                f"{where}: a second sharded model after loading the first's sharded state dict",
                TOLERANCE_TIGHT,
            )


@fsdp2_check("fsdp2.reshard_after_forward_chooses_units", once=True)
def reshard_after_forward_chooses_units(world: WorldLike, impl: Implementation) -> None:
    """Between forward and backward: None reshards every layer but the last; True all; False none; root never."""
    for flag in (None, True, False):
        expected = reshard_expected(flag)
        for rank, found in enumerate(world.run(ranks.resharding, impl, _SEED, {"reshard_after_forward": flag})):
            wrong = {
                unit: found.get(unit)
                for unit in expected.keys() | found.keys()
                if found.get(unit) != expected.get(unit)
            }
            assert not wrong, (
                f"reshard_after_forward={flag}, rank {rank}: units resharded after forward {found}, expected "
                f"{expected} (differs at {sorted(wrong)})"
            )


@fsdp2_check("fsdp2.deferred_sync_reduces_on_the_last_micro_batch", once=True)
def deferred_sync_reduces_on_the_last_micro_batch(world: WorldLike, impl: Implementation) -> None:
    """get_sync_ctx over 2 micro-batches: deferred, only the last reduces (half the reductions); the same grads."""
    micro = 2
    for replicas in richest(world.size):
        layout = _layout_name(replicas, world.size)
        results: list[Accumulation] = world.run(ranks.accumulation, impl, replicas, _SEED, micro)
        for rank, found in enumerate(results):
            deferred, eager, every = found.deferred, found.eager, found.params
            where = f"{layout}, rank {rank}"
            assert eager.held == [every] * micro, (
                f"defer_fsdp_grad_sync=False, {where}: parameters holding a reduced gradient after each micro-batch "
                f"{eager.held}; expected all {every} after each (every micro-batch reduces)"
            )
            assert deferred.held == [0] * (micro - 1) + [every], (
                f"defer_fsdp_grad_sync=True, {where}: parameters holding a reduced gradient after each micro-batch "
                f"{deferred.held}; expected none before the last (the optimizer step's), all {every} after it"
            )
            # Counted where the profiler records the backend's collectives (gloo does); the held gradients
            # above prove the deferral either way.
            assert not eager.reductions or deferred.reductions * micro == eager.reductions, (
                f"defer_fsdp_grad_sync=True, {where}: {deferred.reductions} gradient reductions over {micro} "
                f"micro-batches, {eager.reductions} without deferral; expected 1/{micro} of them (the last "
                "micro-batch's only)"
            )
            for mode, run in (("deferred", deferred), ("eager", eager)):
                assert_close_lists(
                    run.grads,
                    found.expected,
                    f"defer_fsdp_grad_sync={mode == 'deferred'}, {where}: accumulated gradients vs one process",
                    TOLERANCE_FLOAT64,
                )


@fsdp2_check("fsdp2.functional_entry_point_keeps_upstream_defaults", once=True)
def functional_entry_point_keeps_upstream_defaults(world: WorldLike, impl: Implementation) -> None:
    """fsdp2_strategy_parallelize's own defaults are upstream's: prefetch on (depths 1 forward, 2 backward), the
    resharding heuristic; NOT SUPPORTED where the module has no such function (upstream keeps it elsewhere)."""
    results: list[FunctionalLayout] = world.run(ranks.functional_layout, impl, _SEED)
    for rank, found in enumerate(results):
        where = f"fsdp2_strategy_parallelize(model, mesh, mp_policy=MixedPrecisionPolicy()), rank {rank}"
        expected_chains = prefetch_chains(1, 2)
        assert [tuple(c) for c in found.prefetch] == expected_chains, (
            f"{where}: prefetch chains {found.prefetch}, expected {expected_chains} (its defaults: prefetch on, "
            "forward depth 1, backward depth 2)"
        )
        expected = reshard_expected(None)
        assert found.resharded == expected, (
            f"{where}: units resharded after forward {found.resharded}, expected {expected} "
            "(its default reshard_after_forward=None)"
        )


#: (config fields, the prefetch chains they give): off by default (upstream's config), each depth, none without
#: resharding (nothing to prefetch).
_PREFETCH: list[tuple[dict[str, Any], list[tuple[str, str, list[str]]]]] = [
    ({}, []),
    ({"enable_fsdp2_prefetch": True}, prefetch_chains(1, 2)),
    (
        {"enable_fsdp2_prefetch": True, "fsdp2_forward_prefetch_depth": 2, "fsdp2_backward_prefetch_depth": 1},
        prefetch_chains(2, 1),
    ),
    ({"enable_fsdp2_prefetch": True, "reshard_after_forward": False}, []),
]


@fsdp2_check("fsdp2.prefetch_chains_have_configured_depth", once=True)
def prefetch_chains_have_configured_depth(world: WorldLike, impl: Implementation) -> None:
    """Prefetch off by default; on, each layer prefetches the next N (forward) and previous M (backward) layers."""
    for fields, expected in _PREFETCH:
        for rank, found in enumerate(world.run(ranks.prefetch, impl, _SEED, fields)):
            assert [tuple(c) for c in found] == expected, (
                f"FSDP2Config({fields}), rank {rank}: prefetch chains {found}, expected {expected}"
            )


@fsdp2_check("fsdp2.cpu_offload_trains_and_offloads", once=True)
def cpu_offload_trains_and_offloads(world: WorldLike, impl: Implementation) -> None:
    """CPUOffloadPolicy reaches every unit and keeps training equal to one process; without it, no unit offloads.

    Read from each unit's FSDP parameter group (torch's private state: on
    CPU, where the parameters live says nothing).
    """
    for fields, offloads in (({"offload_policy": "cpu"}, True), ({}, False)):
        results: list[Offload] = world.run(ranks.offload, impl, _SEED, fields)
        for rank, found in enumerate(results):
            wrong = {unit: got for unit, got in found.policies.items() if (got == "CPUOffloadPolicy") != offloads}
            assert found.policies, f"rank {rank}: no FSDP unit found after parallelize"
            assert not wrong, (
                f"offload_policy={fields.get('offload_policy')}, rank {rank}: units' offload policies "
                f"{found.policies}, expected " + ("CPUOffloadPolicy on each" if offloads else "none offloading")
            )
    _assert_trained(world, impl, "CPU offload", {"offload_policy": "cpu"}, tied=False, optimizers=("adam",))


#: (mode, scope, whether TinyLM's layers, the language group, are recomputed).
_CHECKPOINTING: list[tuple[bool | str, str, bool]] = [
    (False, "all", False),
    (True, "all", True),
    (True, "language", True),
    (True, "vision", False),
    ("selective", "language", True),
]


@fsdp2_check("fsdp2.activation_checkpointing_recomputes_selected_layers", once=True)
def activation_checkpointing_recomputes_selected_layers(world: WorldLike, impl: Implementation) -> None:
    """Checkpointing reruns the selected groups' attention and MLP in backward, scope respected (full: every matmul;
    selective: at least one op and fewer than full); gradients unchanged."""
    unobserved = []
    for mode, scope, selected in _CHECKPOINTING:
        results: list[Checkpointing] = world.run(ranks.checkpointing, impl, _SEED, mode, scope)
        for rank, found in enumerate(results):
            where = f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}"
            role = "language group, " + ("selected" if selected else "not selected")
            for block, run in found.checkpointed.runs.items():
                unobserved.append(judge_block(mode, selected, f"{where}: {block} ({role})", run))
            with explained("gradients"):
                assert_close_lists(
                    found.checkpointed.grads,
                    found.plain.grads,
                    f"{where}: gradients vs no checkpointing",
                    TOLERANCE_TIGHT,
                )
    raise_unobserved(unobserved)
