"""Independent config fork (test fixture): ``DDPConfig`` written from the contract (docs/contract.md), no nemo_dist code.

Validation is table-driven: each bool field is checked by one loop, the scope is
parsed with ``str.replace`` + ``split``, and every error names ``DDPConfig.<field>``.
An autocast dtype may be given by name ("bfloat16"), as the reference's docstring
promises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch

__all__ = ["DDPConfig"]

_GROUPS = frozenset({"language", "vision", "audio", "multimodal"})
_BOOL_FIELDS = ("broadcast_buffers", "find_unused_parameters", "static_graph", "gradient_as_bucket_view")


def _scope(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        parts = value.replace("+", ",").split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = list(value)
    else:
        raise TypeError(f"DDPConfig.activation_checkpointing_scope: expected str or list of str, got {value!r}")
    names: list[str] = []
    for part in parts:
        name = part.strip().lower()
        if name and name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"DDPConfig.activation_checkpointing_scope: no group named in {value!r}")
    if "all" in names:
        if len(names) > 1:
            raise ValueError(f"DDPConfig.activation_checkpointing_scope: 'all' must stand alone, got {value!r}")
        return ("all",)
    bad = [n for n in names if n not in _GROUPS]
    if bad:
        raise ValueError(f"DDPConfig.activation_checkpointing_scope: unknown group(s) {bad}, valid: {sorted(_GROUPS)}")
    return tuple(names)


@dataclass
class DDPConfig:
    """DDP settings; invalid values raise TypeError/ValueError naming the field at construction."""

    activation_checkpointing: Union[bool, str] = False
    activation_checkpointing_scope: Union[str, Sequence[str]] = "all"
    broadcast_buffers: bool = False
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: Union[float, None] = None
    gradient_as_bucket_view: bool = False
    autocast_dtype: Union[torch.dtype, None] = None

    def __post_init__(self) -> None:
        mode = self.activation_checkpointing
        if isinstance(mode, str) and mode.lower() in ("full", "selective"):
            self.activation_checkpointing = mode.lower()
        elif not isinstance(mode, bool):
            raise ValueError(f"DDPConfig.activation_checkpointing: expected bool, 'full' or 'selective', got {mode!r}")
        self.activation_checkpointing_scope = _scope(self.activation_checkpointing_scope)
        for name in _BOOL_FIELDS:
            if type(getattr(self, name)) is not bool:
                raise TypeError(f"DDPConfig.{name}: expected a bool, got {getattr(self, name)!r}")
        cap = self.bucket_cap_mb
        if cap is not None:
            if type(cap) not in (int, float):
                raise TypeError(f"DDPConfig.bucket_cap_mb: expected a number of MiB, got {cap!r}")
            if not 0 < cap < float("inf"):
                raise ValueError(f"DDPConfig.bucket_cap_mb: expected a positive finite size, got {cap!r}")
        dtype = self.autocast_dtype
        if isinstance(dtype, str):  # a dtype's name, as a YAML file gives it: "bfloat16" or "torch.bfloat16"
            name = dtype.split(".", 1)[1] if dtype.startswith("torch.") else dtype
            dtype = self.autocast_dtype = getattr(torch, name, dtype)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"DDPConfig.autocast_dtype: expected a float torch.dtype or None, got {dtype!r}")
