"""Conformance checks of ``FSDP2Config`` itself: its defaults and its validation (no process group needed).

Each runs once, in the parent (``world`` is None), on the fsdp2 module's
``FSDP2Config``. Core is what upstream 0.7.0 does: its defaults (the bf16
policy with a float32 reduction, prefetch off in the config, deferred sync
on) and its scope validation, shared with ``DDPConfig``. Every other bad
value failing at construction, naming the field, is nemo_dist's promise
(extended): upstream's dataclass stores a string where a bool belongs, or a
negative prefetch depth, as given.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import check
from nemo_dist.conformance.suites.config.checks import INVALID_SCOPES, rejection

__all__ = ["FSDP2_DEFAULTS", "INVALID_FSDP2_CONFIGS", "config_defaults", "rejects_bad_values_naming_field"]

#: Upstream's defaults of the FSDP2Config fields the suite's checks exercise (the scope as normalised); the
#: policy's fields compared one by one.
FSDP2_DEFAULTS: dict[str, Any] = {
    "offload_policy": None,
    "activation_checkpointing": False,
    "activation_checkpointing_scope": ("all",),
    "defer_fsdp_grad_sync": True,
    "reshard_after_forward": None,
    "enable_fsdp2_prefetch": False,
    "fsdp2_backward_prefetch_depth": 2,
    "fsdp2_forward_prefetch_depth": 1,
}
#: The default policy: bf16 compute, float32 reduction, no output cast, no input cast.
DEFAULT_POLICY = {
    "param_dtype": torch.bfloat16,
    "reduce_dtype": torch.float32,
    "output_dtype": None,
    "cast_forward_inputs": False,
}

#: (field, bad value): each must fail at construction naming the field (extended).
INVALID_FSDP2_CONFIGS: list[tuple[str, Any]] = [
    ("reshard_after_forward", "yes"),
    ("enable_fsdp2_prefetch", "true"),
    ("defer_fsdp_grad_sync", 1),
    ("fsdp2_forward_prefetch_depth", -1),
    ("fsdp2_backward_prefetch_depth", 1.5),
    ("activation_checkpointing", "sometimes"),
    ("mp_policy", "bf16"),
    ("offload_policy", "cpu"),
    *((field, value) for _, field, value in INVALID_SCOPES),
]


def _config_class(impl: Implementation) -> type:
    found: type = impl.module("fsdp2").FSDP2Config
    return found


@check("fsdp2.config_defaults", tier="core", component="fsdp2", needs_world=False)
def config_defaults(world: None, impl: Implementation) -> None:
    """FSDP2Config() has upstream's defaults: the bf16 policy reducing in float32, prefetch off, deferred sync."""
    config = _config_class(impl)()
    for field, expected in FSDP2_DEFAULTS.items():
        got = getattr(config, field, "<missing>")
        assert got == expected, f"FSDP2Config().{field} is {got!r}, upstream's default is {expected!r}"
    policy = getattr(config, "mp_policy", None)
    got = {field: getattr(policy, field, "<missing>") for field in DEFAULT_POLICY}
    assert got == DEFAULT_POLICY, (
        f"FSDP2Config().mp_policy is {policy!r}; upstream's default policy has {DEFAULT_POLICY}"
    )


@check("fsdp2.config_scope_names_validated", tier="core", component="fsdp2", needs_world=False)
def config_scope_names_validated(world: None, impl: Implementation) -> None:
    """Unknown scope names, "all" mixed with others, a non-str scope fail at construction naming the field."""
    for _, field, value in INVALID_SCOPES:
        rejection(_config_class(impl), field, value)


@check("fsdp2.config_rejects_bad_values_naming_field", tier="extended", component="fsdp2", needs_world=False)
def rejects_bad_values_naming_field(world: None, impl: Implementation) -> None:
    """Every bad value (a str or int flag, a negative or float depth, a policy that is none) fails naming it."""
    for field, value in INVALID_FSDP2_CONFIGS:
        rejection(_config_class(impl), field, value)
