"""Layer 0: no process, no world. DDPConfig rejects every bad value naming the field, and normalises the rest."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from nemo_dist.distributed.config import DDPConfig

INVALID: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "negative_bucket",
        {"bucket_cap_mb": -1.0},
        ValueError,
        "bucket_cap_mb must be a positive number of MiB, got -1.0",
    ),
    ("zero_bucket", {"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb must be a positive number of MiB, got 0"),
    ("nan_bucket", {"bucket_cap_mb": float("nan")}, ValueError, "bucket_cap_mb must be a positive number of MiB"),
    ("inf_bucket", {"bucket_cap_mb": float("inf")}, ValueError, "bucket_cap_mb must be a positive number of MiB"),
    ("string_bucket", {"bucket_cap_mb": "25"}, TypeError, "bucket_cap_mb must be a number of MiB or None, got '25'"),
    ("bool_bucket", {"bucket_cap_mb": True}, TypeError, "bucket_cap_mb must be a number of MiB or None, got True"),
    ("string_broadcast_buffers", {"broadcast_buffers": "yes"}, TypeError, "broadcast_buffers must be a bool"),
    ("int_find_unused_parameters", {"find_unused_parameters": 1}, TypeError, "find_unused_parameters must be a bool"),
    ("string_static_graph", {"static_graph": "true"}, TypeError, "static_graph must be a bool, got 'true'"),
    ("none_gradient_as_bucket_view", {"gradient_as_bucket_view": None}, TypeError, "gradient_as_bucket_view must be"),
    ("unknown_checkpointing_mode", {"activation_checkpointing": "sometimes"}, ValueError, "activation_checkpointing"),
    ("int_checkpointing_mode", {"activation_checkpointing": 1}, TypeError, "activation_checkpointing must be a bool"),
    (
        "unknown_scope",
        {"activation_checkpointing_scope": "robotics"},
        ValueError,
        "unknown layer group(s) ['robotics']",
    ),
    ("unknown_scope_in_list", {"activation_checkpointing_scope": ["vision", "sound"]}, ValueError, "['sound']"),
    (
        "all_mixed_with_group",
        {"activation_checkpointing_scope": "all,language"},
        ValueError,
        "'all' cannot be combined",
    ),
    (
        "all_mixed_in_list",
        {"activation_checkpointing_scope": ["vision", "all"]},
        ValueError,
        "'all' cannot be combined",
    ),
    ("empty_scope", {"activation_checkpointing_scope": " , "}, ValueError, "activation_checkpointing_scope is empty"),
    ("int_scope", {"activation_checkpointing_scope": 3}, TypeError, "activation_checkpointing_scope must be a str"),
    (
        "unknown_dtype_name",
        {"autocast_dtype": "bfloat17"},
        ValueError,
        "autocast_dtype: 'bfloat17' names no torch dtype",
    ),
    ("integer_dtype", {"autocast_dtype": torch.int32}, ValueError, "autocast_dtype must be a floating-point dtype"),
    ("int_dtype", {"autocast_dtype": 16}, TypeError, "autocast_dtype must be a torch.dtype or None, got 16"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_value_raises_naming_field(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    """Each invalid DDPConfig value raises its error type at construction with a message naming field and value."""
    (field,) = kwargs
    with pytest.raises(error, match=re.escape(message)) as raised:
        DDPConfig(**kwargs)
    assert f"DDPConfig.{field}" in str(raised.value)


VALID: list[tuple[str, dict[str, Any], str, Any]] = [
    (
        "scope_comma",
        {"activation_checkpointing_scope": "language,vision"},
        "activation_checkpointing_scope",
        ("language", "vision"),
    ),
    (
        "scope_plus",
        {"activation_checkpointing_scope": "language+vision"},
        "activation_checkpointing_scope",
        ("language", "vision"),
    ),
    (
        "scope_list",
        {"activation_checkpointing_scope": ["vision", "language"]},
        "activation_checkpointing_scope",
        ("vision", "language"),
    ),
    (
        "scope_spaces_case",
        {"activation_checkpointing_scope": " Audio + vision "},
        "activation_checkpointing_scope",
        ("audio", "vision"),
    ),
    ("scope_default", {}, "activation_checkpointing_scope", ("all",)),
    ("mode_case", {"activation_checkpointing": "Selective"}, "activation_checkpointing", "selective"),
    ("mode_true", {"activation_checkpointing": True}, "activation_checkpointing", True),
    ("bucket_int", {"bucket_cap_mb": 25}, "bucket_cap_mb", 25),
    ("bucket_small_float", {"bucket_cap_mb": 0.001}, "bucket_cap_mb", 0.001),
    ("dtype_name", {"autocast_dtype": "bfloat16"}, "autocast_dtype", torch.bfloat16),
    ("dtype_qualified_name", {"autocast_dtype": "torch.float16"}, "autocast_dtype", torch.float16),
]


@pytest.mark.parametrize(("kwargs", "field", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_value_is_normalised(kwargs: dict[str, Any], field: str, expected: Any) -> None:
    """Valid values are accepted and normalised: scopes to tuples, mode strings lower-cased, dtype names resolved."""
    got = getattr(DDPConfig(**kwargs), field)
    assert got == expected
    assert type(got) is type(expected)
