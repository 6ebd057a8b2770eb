"""Conformance checks of ``DDPConfig``.

These need no process group: each runs once, in the parent process (``world``
is None).  The defaults are the contract's table (docs/contract.md); scopes are normalised to a
tuple, and unknown or mixed scope names fail at construction naming the
field: that is what upstream's dataclass does (core).  Every other bad value
(a negative bucket size, a string where a bool belongs) failing at
construction is nemo_dist's promise (extended).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import check
from nemo_dist.conformance.suites.ddp.configs import DDP_CONFIG_DEFAULTS

__all__ = [
    "CONTRACT_DEFAULTS",
    "INVALID_CONFIGS",
    "INVALID_SCOPES",
    "SCOPE_NORMALISATIONS",
    "VALUE_NORMALISATIONS",
    "config_rejection",
    "rejection",
]

#: The contract's defaults of every DDPConfig field (docs/contract.md; the scope as normalised).
CONTRACT_DEFAULTS: dict[str, Any] = {**DDP_CONFIG_DEFAULTS, "activation_checkpointing_scope": ("all",)}

#: (readable id, field, bad value): scope names upstream rejects, naming the field (core).
INVALID_SCOPES: list[tuple[str, str, Any]] = [
    ("unknown_scope", "activation_checkpointing_scope", "robotics"),
    ("unknown_scope_in_list", "activation_checkpointing_scope", ["language", "robotics"]),
    ("all_mixed_with_group", "activation_checkpointing_scope", "all,language"),
    ("all_mixed_in_list", "activation_checkpointing_scope", ["vision", "all"]),
    ("unknown_scope_sorting_before_all", "activation_checkpointing_scope", "acoustic"),
    ("int_scope", "activation_checkpointing_scope", 3),
    ("non_str_in_scope_list", "activation_checkpointing_scope", ["language", 3]),
]

#: (readable id, field, bad value): every bad value, scopes included, must fail at construction naming the field.
INVALID_CONFIGS: list[tuple[str, str, Any]] = [
    ("negative_bucket", "bucket_cap_mb", -1.0),
    ("zero_bucket", "bucket_cap_mb", 0),
    ("nan_bucket", "bucket_cap_mb", float("nan")),
    ("inf_bucket", "bucket_cap_mb", float("inf")),
    ("string_bucket", "bucket_cap_mb", "25"),
    ("bool_bucket", "bucket_cap_mb", True),
    ("string_broadcast_buffers", "broadcast_buffers", "yes"),
    ("string_find_unused_parameters", "find_unused_parameters", "False"),
    ("int_find_unused_parameters", "find_unused_parameters", 1),
    ("string_static_graph", "static_graph", "true"),
    ("string_gradient_as_bucket_view", "gradient_as_bucket_view", "no"),
    ("none_gradient_as_bucket_view", "gradient_as_bucket_view", None),
    ("unknown_checkpointing_mode", "activation_checkpointing", "sometimes"),
    ("int_checkpointing_mode", "activation_checkpointing", 1),
    ("empty_scope", "activation_checkpointing_scope", " , "),
    ("unknown_dtype_name", "autocast_dtype", "bfloat17"),
    ("integer_dtype", "autocast_dtype", torch.int32),
    ("int_dtype", "autocast_dtype", 16),
    *INVALID_SCOPES,
]

#: (scope as given, the groups it must normalise to, as a set; the result is a tuple).
SCOPE_NORMALISATIONS: list[tuple[Any, set[str]]] = [
    ("all", {"all"}),
    ("language,vision", {"language", "vision"}),
    ("language+vision", {"language", "vision"}),
    (["vision", "language"], {"language", "vision"}),
    ("multimodal", {"multimodal"}),
    (("audio",), {"audio"}),
    (" Audio + vision ", {"audio", "vision"}),
]

#: (field, value as given, the value it must hold, compared with ==, and its type): valid values (extended).
VALUE_NORMALISATIONS: list[tuple[str, Any, Any]] = [
    ("activation_checkpointing", "Selective", "selective"),
    ("activation_checkpointing", "FULL", "full"),
    ("activation_checkpointing", True, True),
    ("bucket_cap_mb", 25, 25),
    ("bucket_cap_mb", 0.001, 0.001),
    ("autocast_dtype", "bfloat16", torch.bfloat16),
    ("autocast_dtype", "torch.float16", torch.float16),
    ("autocast_dtype", torch.float16, torch.float16),
]


def config_rejection(impl: Implementation, field: str, value: Any) -> str:
    """Build ``DDPConfig(**{field: value})``; return its error message, or raise AssertionError if accepted.

    The error must be ``TypeError`` or ``ValueError`` and name the field.
    """
    return rejection(impl.module("config").DDPConfig, field, value)


def rejection(config_class: type, field: str, value: Any) -> str:
    """Build ``config_class(**{field: value})``; its error message, or AssertionError if accepted or unnamed.

    The error must be ``TypeError`` or ``ValueError`` (``NotImplementedError``
    is neither: a bad value is no missing feature) and name the field.
    """
    name = config_class.__name__
    try:
        config = config_class(**{field: value})
    except (TypeError, ValueError) as error:
        raised: TypeError | ValueError = error
    else:
        raise AssertionError(
            f"{name}({field}={value!r}) was accepted (now {getattr(config, field, '?')!r}); "
            "expected TypeError or ValueError naming the field"
        )
    message = str(raised)
    assert field in message, f"{name}({field}={value!r}) raised {type(raised).__name__} not naming the field: {message}"
    return message


@check("config.defaults_match_spec", tier="core", component="config", needs_world=False)
def defaults_match_spec(world: None, impl: Implementation) -> None:
    """DDPConfig() has the contract's default (docs/contract.md) for every field."""
    config = impl.module("config").DDPConfig()
    for field, expected in CONTRACT_DEFAULTS.items():
        got = getattr(config, field, "<missing>")
        assert got == expected, (
            f"DDPConfig().{field} is {got!r}, the contract's default (docs/contract.md) is {expected!r}"
        )


@check("config.scope_names_validated", tier="core", component="config", needs_world=False)
def scope_names_validated(world: None, impl: Implementation) -> None:
    """Unknown scope names, "all" mixed with others, a non-str scope or entry fail at construction naming the field."""
    for _, field, value in INVALID_SCOPES:
        config_rejection(impl, field, value)


@check("config.rejects_bad_values_naming_field", tier="extended", component="config", needs_world=False)
def rejects_bad_values_naming_field(world: None, impl: Implementation) -> None:
    """Every bad value (bucket not a positive finite number, non-bool flag, bad mode, scope, dtype) fails naming it."""
    for _, field, value in INVALID_CONFIGS:
        config_rejection(impl, field, value)


@check("config.scope_normalised_to_tuple", tier="core", component="config", needs_world=False)
def scope_normalised_to_tuple(world: None, impl: Implementation) -> None:
    """activation_checkpointing_scope given as str with , or + or a list becomes a tuple of its groups."""
    config_class = impl.module("config").DDPConfig
    for scope, groups in SCOPE_NORMALISATIONS:
        got = config_class(activation_checkpointing_scope=scope).activation_checkpointing_scope
        expected = f"expected a tuple of {sorted(groups)}"
        assert isinstance(got, tuple), f"activation_checkpointing_scope={scope!r} became {got!r}, {expected}"
        assert sorted(got) == sorted(groups), f"activation_checkpointing_scope={scope!r} became {got!r}, {expected}"


@check("config.valid_values_normalised", tier="extended", component="config", needs_world=False)
def valid_values_normalised(world: None, impl: Implementation) -> None:
    """Valid values are kept or normalised: mode names lower-cased, dtype names resolved, numbers and bools as given."""
    config_class = impl.module("config").DDPConfig
    for field, value, expected in VALUE_NORMALISATIONS:
        got = getattr(config_class(**{field: value}), field, "<missing>")
        assert (got, type(got)) == (expected, type(expected)), (
            f"DDPConfig({field}={value!r}).{field} is {got!r} ({type(got).__name__}), "
            f"expected {expected!r} ({type(expected).__name__})"
        )
