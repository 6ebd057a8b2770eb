"""Broken config fork (test fixture): a scope list holding a non-str (``["language", 3]``) is accepted.

The entries that are not str are dropped silently. Guarded by
``config.scope_names_validated`` (core: upstream rejects such a list naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_dist.distributed.config import DDPConfig as _ReferenceConfig

__all__ = ["DDPConfig"]


@dataclass
class DDPConfig(_ReferenceConfig):
    """The reference config, except that non-str entries of a scope list are ignored."""

    def __post_init__(self) -> None:
        scope = self.activation_checkpointing_scope
        if isinstance(scope, (list, tuple)):
            self.activation_checkpointing_scope = [name for name in scope if isinstance(name, str)]  # the bug
        super().__post_init__()
