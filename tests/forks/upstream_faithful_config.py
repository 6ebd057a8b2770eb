"""Upstream-faithful config fork (test fixture): ``DDPConfig`` as NeMo Automodel 0.7.0 documents and ships it.

Written from upstream 0.7.0's documented behaviour (its ``DDPConfig`` fields,
defaults and scope normalisation); no upstream or nemo_dist code is copied or
imported.  Like upstream it validates only ``activation_checkpointing_scope``:
every other field is stored as given.  It must conform on the core tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal, Union

import torch

__all__ = ["DDPConfig", "normalize_activation_checkpointing_scope"]

_SCOPES = ("all", "language", "vision", "audio", "multimodal")
_ALIASES = {"default": "all", "auto": "all"}


def _parts(text: str) -> list[str]:
    """Lower-case, "-" as "_", "+" as ",", then split on ","."""
    return text.lower().replace("-", "_").replace("+", ",").split(",")


def normalize_activation_checkpointing_scope(value: Any) -> tuple[str, ...]:
    """The scope as a tuple of distinct names; None or nothing named means ("all",).

    Accepts a str or a list/tuple/set of str; "default" and "auto" mean "all".
    Anything else, an unknown name, or "all" next to another name is a
    ``ValueError`` naming ``activation_checkpointing_scope``.
    """
    if value is None:
        return ("all",)
    if isinstance(value, str):
        raw = _parts(value)
    elif isinstance(value, (list, tuple, set)):
        items: Iterable[Any] = value
        raw = []
        for item in items:
            if not isinstance(item, str):
                raise ValueError(f"activation_checkpointing_scope: every entry must be a str, got {item!r}")
            raw.extend(_parts(item))
    else:
        raise ValueError(f"activation_checkpointing_scope: expected a str or a list of str, got {value!r}")
    names: list[str] = []
    for part in raw:
        name = _ALIASES.get(part.strip(), part.strip())
        if not name:
            continue
        if name not in _SCOPES:
            raise ValueError(f"activation_checkpointing_scope: {part!r} is none of {', '.join(sorted(_SCOPES))}")
        if name not in names:
            names.append(name)
    if not names:
        return ("all",)
    if "all" in names and len(names) > 1:
        raise ValueError(f"activation_checkpointing_scope: 'all' cannot be combined with {names}")
    return tuple(names)


@dataclass
class DDPConfig:
    """DDP options; only the scope is checked (and normalised to a tuple) at construction."""

    activation_checkpointing: Union[bool, Literal["full", "selective"]] = False
    activation_checkpointing_scope: Union[str, list[str], tuple[str, ...]] = "all"
    broadcast_buffers: bool = False
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: Union[float, None] = None
    gradient_as_bucket_view: bool = False
    autocast_dtype: Union[torch.dtype, None] = None

    def __post_init__(self) -> None:
        self.activation_checkpointing_scope = normalize_activation_checkpointing_scope(
            self.activation_checkpointing_scope
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (values as stored, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
