"""``DDPConfig``: what ``DDPManager`` builds, validated at construction."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch

__all__ = ["CHECKPOINT_GROUPS", "DDPConfig"]

#: Layer groups that ``activation_checkpointing_scope`` may name besides "all".
CHECKPOINT_GROUPS = ("language", "vision", "audio", "multimodal")
_CHECKPOINT_MODES = ("full", "selective")


def _require_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"DDPConfig.{field} must be a bool, got {value!r} ({type(value).__name__})")


def _normalise_checkpointing(value: Any, owner: str = "DDPConfig") -> bool | str:
    """``value`` as a checkpointing mode (a bool, "full" or "selective"); errors name ``owner``'s field."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"{owner}.activation_checkpointing must be a bool or one of 'full', 'selective', "
            f"got {value!r} ({type(value).__name__})"
        )
    if value.strip().lower() in _CHECKPOINT_MODES:
        return value.strip().lower()
    raise ValueError(
        f"{owner}.activation_checkpointing must be False, True, 'full' or 'selective', "
        f"got {value!r}"
    )


def _normalise_scope(value: Any, owner: str = "DDPConfig") -> tuple[str, ...]:
    """``value`` as a tuple of layer-group names ("all" alone); errors name ``owner``'s field."""
    if isinstance(value, str):
        names = [part.strip().lower() for part in re.split(r"[,+]", value)]
    elif isinstance(value, Sequence) and all(isinstance(part, str) for part in value):
        names = [part.strip().lower() for part in value]
    else:
        raise TypeError(
            f"{owner}.activation_checkpointing_scope must be a str or a list of str, "
            f"got {value!r}"
        )
    names = [name for name in names if name]
    if not names:
        raise ValueError(f"{owner}.activation_checkpointing_scope is empty: {value!r}")
    unknown = [name for name in names if name != "all" and name not in CHECKPOINT_GROUPS]
    if unknown:
        raise ValueError(
            f"{owner}.activation_checkpointing_scope: unknown layer group(s) {unknown} in "
            f"{value!r}; expected 'all' or some of {list(CHECKPOINT_GROUPS)}"
        )
    if "all" in names and len(set(names)) > 1:
        raise ValueError(
            f"{owner}.activation_checkpointing_scope: 'all' cannot be combined with other "
            f"groups, got {value!r}"
        )
    return tuple(dict.fromkeys(names))


def _normalise_bucket_cap(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"DDPConfig.bucket_cap_mb must be a number of MiB or None, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"DDPConfig.bucket_cap_mb must be a positive number of MiB, got {value!r}")
    return value


def _normalise_dtype(value: Any) -> torch.dtype | None:
    if value is None:
        return None
    if isinstance(value, str):
        resolved = getattr(torch, value.strip().removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"DDPConfig.autocast_dtype: {value!r} names no torch dtype")
        value = resolved
    if not isinstance(value, torch.dtype):
        raise TypeError(f"DDPConfig.autocast_dtype must be a torch.dtype or None, got {value!r}")
    if not value.is_floating_point:
        raise ValueError(f"DDPConfig.autocast_dtype must be a floating-point dtype, got {value}")
    return value


@dataclass
class DDPConfig:
    """Configuration for ``DDPManager``; every field is checked when it is built.

    Wrong types raise ``TypeError`` and bad values ``ValueError``, each naming
    the field and the value.  ``activation_checkpointing`` strings are lower-cased,
    ``activation_checkpointing_scope`` becomes a tuple of group names and
    ``autocast_dtype`` strings ("bfloat16") become ``torch.dtype``.
    """

    #: ``True``/``"full"``: checkpoint whole layer blocks; ``"selective"``: selective
    #: activation checkpointing of the blocks; ``False``: none.
    activation_checkpointing: Union[bool, str] = False
    #: Layer groups to checkpoint: ``"all"`` or some of language, vision, audio,
    #: multimodal (vision + audio), as a str joined by "," or "+", or a list.
    activation_checkpointing_scope: Union[str, Sequence[str]] = "all"
    #: DDP syncs module buffers from rank 0 at construction and before each forward;
    #: ``False`` syncs them never (upstream's ``broadcast_buffers`` meaning).
    broadcast_buffers: bool = False
    #: Forwarded to DDP: tolerate parameters that get no gradient in an iteration.
    find_unused_parameters: bool = False
    #: Forwarded to DDP: the graph is the same every iteration.
    static_graph: bool = False
    #: DDP gradient bucket size in MiB; ``None`` keeps PyTorch's default (25).
    bucket_cap_mb: Union[float, None] = None
    #: Gradients become views into DDP's communication buckets.
    gradient_as_bucket_view: bool = False
    #: When set, the wrapped model's forward runs under ``torch.autocast`` with it.
    autocast_dtype: Union[torch.dtype, None] = None

    def __post_init__(self) -> None:
        self.activation_checkpointing = _normalise_checkpointing(self.activation_checkpointing)
        self.activation_checkpointing_scope = _normalise_scope(self.activation_checkpointing_scope)
        for field in ("broadcast_buffers", "find_unused_parameters", "static_graph", "gradient_as_bucket_view"):
            _require_bool(field, getattr(self, field))
        self.bucket_cap_mb = _normalise_bucket_cap(self.bucket_cap_mb)
        self.autocast_dtype = _normalise_dtype(self.autocast_dtype)
