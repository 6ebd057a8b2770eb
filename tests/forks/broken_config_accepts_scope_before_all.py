"""Broken config fork (test fixture): an unknown scope name that sorts before "all" (``"acoustic"``) is accepted.

The name is compared with ``"all"`` by order (``>``) where it should be by
inequality (``!=``): a cosmic-ray mutant of the reference's scope check.
Guarded by ``config.scope_names_validated`` (core: upstream rejects unknown names).
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_dist.distributed.config import DDPConfig as _ReferenceConfig

__all__ = ["DDPConfig"]


@dataclass
class DDPConfig(_ReferenceConfig):
    """The reference config, except that a lone scope name sorting before "all" is kept as a group."""

    def __post_init__(self) -> None:
        scope = self.activation_checkpointing_scope
        name = scope.strip().lower() if isinstance(scope, str) else "all"
        kept = name.isalpha() and name < "all"  # the deliberate bug: only names after "all" are looked up
        if kept:
            self.activation_checkpointing_scope = "all"
        super().__post_init__()
        if kept:
            self.activation_checkpointing_scope = (name,)
