"""Broken config fork (test fixture): a scope naming no group (``" , "``) is read as ``"all"``, as upstream reads it.

Guarded by ``config.rejects_bad_values_naming_field`` (extended: upstream
accepts it): an empty scope must fail naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nemo_dist.distributed.config import DDPConfig as _ReferenceConfig

__all__ = ["DDPConfig"]


@dataclass
class DDPConfig(_ReferenceConfig):
    """The reference config, except that an empty scope string means every group."""

    def __post_init__(self) -> None:
        scope = self.activation_checkpointing_scope
        if isinstance(scope, str) and not re.sub(r"[\s,+]", "", scope):
            self.activation_checkpointing_scope = "all"  # the deliberate bug: nothing named is not an error
        super().__post_init__()
