"""Broken config fork: boolean fields accept strings and coerce them with ``bool()``, so "false" means True.

Otherwise the bundled ``DDPConfig``. The conformance suite must fail it: a
string where a bool belongs has to fail at construction naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_dist.distributed.config import DDPConfig as _Reference

__all__ = ["DDPConfig"]

_BOOL_FIELDS = ("broadcast_buffers", "find_unused_parameters", "static_graph", "gradient_as_bucket_view")


@dataclass
class DDPConfig(_Reference):
    """The bundled config, except that bool fields take any value and keep its truthiness."""

    def __post_init__(self) -> None:
        for field in _BOOL_FIELDS:
            setattr(self, field, bool(getattr(self, field)))  # BUG: bool("false") is True
        super().__post_init__()
