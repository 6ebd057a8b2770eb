"""Layer 0 (no process group): ``FSDP2Config`` and ``ParallelismSizes`` validate every field, with upstream's defaults.

Every invalid value raises at construction (``TypeError``/``ValueError``, or
``NotImplementedError`` for what this component does not do), naming the
field; the mesh shape a world gets, or the error it gets, needs no world.
The FSDP2 modules are imported by the tests that use them, not at collection
(``torch.distributed.fsdp`` costs about a second).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

from nemo_dist.distributed.mesh import ParallelismSizes
from tests import targets

# id: (keyword arguments, exception type, message pattern)
CONFIG_ERRORS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "mp-policy-string": ({"mp_policy": "bf16"}, TypeError, r"FSDP2Config\.mp_policy must be a .*MixedPrecisionPolicy"),
    "offload-policy-bool": ({"offload_policy": True}, TypeError, r"FSDP2Config\.offload_policy must be"),
    "checkpointing-unknown": (
        {"activation_checkpointing": "partial"},
        ValueError,
        r"FSDP2Config\.activation_checkpointing must be False, True, 'full' or 'selective', got 'partial'",
    ),
    "checkpointing-int": ({"activation_checkpointing": 1}, TypeError, r"FSDP2Config\.activation_checkpointing must"),
    "scope-unknown-group": (
        {"activation_checkpointing_scope": "text"},
        ValueError,
        r"FSDP2Config\.activation_checkpointing_scope: unknown layer group\(s\) \['text'\]",
    ),
    "scope-all-and-vision": (
        {"activation_checkpointing_scope": ["all", "vision"]},
        ValueError,
        r"FSDP2Config\.activation_checkpointing_scope: 'all' cannot be combined",
    ),
    "defer-string": ({"defer_fsdp_grad_sync": "true"}, TypeError, r"FSDP2Config\.defer_fsdp_grad_sync must be a bool"),
    "reshard-int": ({"reshard_after_forward": 1}, TypeError, r"FSDP2Config\.reshard_after_forward must be a bool"),
    "prefetch-none": ({"enable_fsdp2_prefetch": None}, TypeError, r"FSDP2Config\.enable_fsdp2_prefetch must be a bool"),
    "backward-depth-negative": (
        {"fsdp2_backward_prefetch_depth": -1},
        ValueError,
        r"FSDP2Config\.fsdp2_backward_prefetch_depth must be >= 0 .*, got -1",
    ),
    "forward-depth-float": (
        {"fsdp2_forward_prefetch_depth": 1.5},
        TypeError,
        r"FSDP2Config\.fsdp2_forward_prefetch_depth must be an int",
    ),
    "forward-depth-bool": (
        {"fsdp2_forward_prefetch_depth": True},
        TypeError,
        r"FSDP2Config\.fsdp2_forward_prefetch_depth must be an int",
    ),
    "sequence-parallel-str": (
        {"sequence_parallel": "yes"}, TypeError, r"FSDP2Config\.sequence_parallel must be a bool, got 'yes'"
    ),
    "tp-plan-list": (
        {"tp_plan": ["lm_head"]}, TypeError, r"FSDP2Config\.tp_plan must be a dict of parallel styles, a 'module:name'"
    ),
    "async-tp": (
        {"enable_async_tensor_parallel": True},
        NotImplementedError,
        r"FSDP2Config\.enable_async_tensor_parallel=True is not supported",
    ),
    "compile": ({"enable_compile": True}, NotImplementedError, r"FSDP2Config\.enable_compile=True is not supported"),
}

SIZES_ERRORS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "context": ({"cp_size": 2}, NotImplementedError, r"cp_size=2: context parallelism is not supported"),
    "pipeline": ({"pp_size": 4}, NotImplementedError, r"pp_size=4: pipeline parallelism is not supported"),
    "expert": ({"ep_size": 8}, NotImplementedError, r"ep_size=8: expert parallelism is not supported"),
    "dp-zero": ({"dp_size": 0}, ValueError, r"ParallelismSizes\.dp_size must be >= 1, got 0"),
    "dp-string": ({"dp_size": "2"}, TypeError, r"ParallelismSizes\.dp_size must be an int, got '2'"),
    "replicas-bool": ({"dp_replicate_size": True}, TypeError, r"ParallelismSizes\.dp_replicate_size must be an int"),
    "tp-zero": ({"tp_size": 0}, ValueError, r"ParallelismSizes\.tp_size must be >= 1"),
    "replicas-not-dividing": (
        {"dp_size": 4, "dp_replicate_size": 3},
        ValueError,
        r"ParallelismSizes\.dp_replicate_size=3 must divide dp_size=4",
    ),
    "pure-replication": (
        {"dp_size": 2, "dp_replicate_size": 2},
        ValueError,
        r"ParallelismSizes\.dp_replicate_size=2 must be less than dp_size=2",
    ),
}


@pytest.mark.parametrize(("options", "kind", "pattern"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_invalid_config_values_raise_naming_the_field(
    options: dict[str, Any], kind: type[Exception], pattern: str
) -> None:
    """Each bad FSDP2Config value raises the stated type at construction, its message naming the field."""
    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    with pytest.raises(kind, match=pattern):
        FSDP2Config(**options)


@pytest.mark.parametrize(("options", "kind", "pattern"), SIZES_ERRORS.values(), ids=SIZES_ERRORS.keys())
def test_invalid_sizes_raise_naming_the_field(options: dict[str, Any], kind: type[Exception], pattern: str) -> None:
    """Each bad ParallelismSizes raises the stated type at construction, its message naming the field."""
    with pytest.raises(kind, match=pattern):
        ParallelismSizes(**options)


@pytest.mark.parametrize(
    ("sizes", "world_size", "expected"),
    [
        pytest.param(ParallelismSizes(), 1, (1, 1, 1, 1, 1), id="world-of-one"),
        pytest.param(ParallelismSizes(), 2, (1, 1, 2, 1, 1), id="fsdp"),
        pytest.param(ParallelismSizes(dp_size=4, dp_replicate_size=2), 4, (1, 2, 2, 1, 1), id="hsdp"),
        pytest.param(ParallelismSizes(dp_replicate_size=1), 3, (1, 1, 3, 1, 1), id="one-replica-is-fsdp"),
        pytest.param(ParallelismSizes(dp_replicate_size=2), 2, r"dp_replicate_size=2 must be less", id="hsdp-of-2"),
        pytest.param(ParallelismSizes(dp_replicate_size=2), 6, (1, 2, 3, 1, 1), id="hsdp-2x3"),
        pytest.param(ParallelismSizes(dp_replicate_size=4), 6, r"dp_replicate_size=4 must divide dp_size=6", id="odd"),
        pytest.param(ParallelismSizes(dp_size=2), 4, r"dp_size=2 does not fit a world of 4 ranks", id="not-the-world"),
        pytest.param(ParallelismSizes(tp_size=2), 4, (1, 1, 2, 1, 2), id="dp-2-tp-2"),
        pytest.param(ParallelismSizes(tp_size=4), 4, (1, 1, 1, 1, 4), id="tp-only"),
        pytest.param(ParallelismSizes(dp_size=2, tp_size=2), 4, (1, 1, 2, 1, 2), id="dp-given-with-tp"),
        pytest.param(ParallelismSizes(tp_size=3), 4, r"tp_size=3 does not divide a world of 4 ranks", id="tp-3-of-4"),
        pytest.param(ParallelismSizes(dp_size=4, tp_size=2), 4, r"dp_size \* tp_size \* cp_size \* pp_size = 8",
                     id="dp-times-tp-not-the-world"),
    ],
)
def test_mesh_shape_follows_upstreams_rules(sizes: ParallelismSizes, world_size: int, expected: Any) -> None:
    """(pp, dp_replicate, dp_shard, cp, tp) for a world, or the ValueError saying which size does not fit it."""
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            sizes.mesh_shape(world_size)
    else:
        assert sizes.mesh_shape(world_size) == expected


def test_defaults_are_upstreams_and_prefetch_is_off() -> None:
    """mp_policy None or default is bf16/fp32 with outputs and inputs uncast; prefetch off (the field, not the
    docstring), depths 2 and 1, deferred sync on, reshard heuristic (None); the functional entry point's prefetch on."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nemo_dist.distributed.fsdp2 import fsdp2_strategy_parallelize
    from nemo_dist.distributed.fsdp2_config import FSDP2Config, default_mp_policy

    upstreams = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=None, cast_forward_inputs=False
    )
    for config in (FSDP2Config(), FSDP2Config(mp_policy=None)):
        assert config.mp_policy == upstreams == default_mp_policy()
        assert config.offload_policy is None
        assert (config.activation_checkpointing, config.activation_checkpointing_scope) == (False, ("all",))
        assert (config.defer_fsdp_grad_sync, config.reshard_after_forward, config.enable_fsdp2_prefetch) == (
            True,
            None,
            False,
        )
        assert (config.fsdp2_backward_prefetch_depth, config.fsdp2_forward_prefetch_depth) == (2, 1)
    assert inspect.signature(fsdp2_strategy_parallelize).parameters["enable_fsdp2_prefetch"].default is True


def test_values_are_normalised_and_policies_kept() -> None:
    """Checkpointing strings lower-cased, scopes a tuple (as DDPConfig), given policies kept as they are."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    offload, policy = CPUOffloadPolicy(pin_memory=False), MixedPrecisionPolicy()
    config = FSDP2Config(
        mp_policy=policy,
        offload_policy=offload,
        activation_checkpointing=" Selective ",
        activation_checkpointing_scope="vision+audio",
    )
    assert config.mp_policy is policy
    assert config.offload_policy is offload
    assert config.activation_checkpointing == "selective"
    assert config.activation_checkpointing_scope == ("vision", "audio")


def test_manager_and_entry_point_refuse_what_they_do_not_offer() -> None:
    """FSDP2Manager wants an FSDP2Config and a DeviceMesh; custom mesh names, other frozen multimodal policies and
    async tensor parallelism are refused before any mesh is touched."""
    from nemo_dist.distributed.fsdp2 import FSDP2Manager, fsdp2_strategy_parallelize
    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    model: Any = torch.nn.Linear(1, 1)
    with pytest.raises(TypeError, match="config must be an FSDP2Config"):
        FSDP2Manager({}, None)
    with pytest.raises(TypeError, match="device_mesh must be a DeviceMesh"):
        FSDP2Manager(FSDP2Config(), None)
    with pytest.raises(ValueError, match="custom mesh dim names are not supported"):
        fsdp2_strategy_parallelize(model, None, tp_mesh_name="tensor")
    with pytest.raises(NotImplementedError, match=re.escape("frozen_multimodal_sharding='replicate'")):
        fsdp2_strategy_parallelize(model, None, frozen_multimodal_sharding="replicate")
    with pytest.raises(NotImplementedError, match="enable_async_tensor_parallel=True is not supported"):
        fsdp2_strategy_parallelize(model, None, enable_async_tensor_parallel=True)


@pytest.mark.upstream
def test_defaults_and_signature_match_released_upstream() -> None:
    """Against nemo-automodel 0.7.0 itself: every FSDP2Config field offered here has upstream's default, and
    fsdp2_strategy_parallelize has upstream's parameters, in upstream's order, with upstream's defaults."""
    from nemo_dist.distributed.fsdp2 import fsdp2_strategy_parallelize
    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    config = targets.import_target("nemo_automodel.components.distributed.config")
    parallelizer = targets.import_target("nemo_automodel.components.distributed.parallelizer")
    theirs, ours = config.FSDP2Config(), FSDP2Config()
    for name in ours.__dataclass_fields__:
        assert getattr(ours, name) == getattr(theirs, name), name
    upstream = inspect.signature(parallelizer.fsdp2_strategy_parallelize).parameters
    mine = inspect.signature(fsdp2_strategy_parallelize).parameters
    assert list(mine) == list(upstream)
    assert {name: p.default for name, p in mine.items()} == {name: p.default for name, p in upstream.items()}
