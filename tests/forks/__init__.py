"""Implementations the conformance tests check (data): broken, independent, upstream-faithful and gallery forks.

Most broken forks are the bundled reference with one thing wrong. The two
helpers here build the common cases: a manager that hands ``parallelize_ddp``
a changed config, and a config that keeps one field's bad value unchecked.
They import the reference only when called, so importing an independent fork
imports no nemo_dist code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["config_keeping", "manager_changing_config"]


def manager_changing_config(change: Callable[[Any], Any], doc: str) -> type:
    """The reference ``DDPManager``, except that ``parallelize`` wraps under ``change(config)``; ``doc`` says how."""
    from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
    from nemo_dist.distributed.ddp import parallelize_ddp

    class DDPManager(_ReferenceManager):
        __doc__ = doc

        def parallelize(self, model: Any) -> Any:
            """``parallelize_ddp`` under the changed config (the deliberate bug)."""
            return parallelize_ddp(model, change(self.config), device=self.device)

    return DDPManager


def config_keeping(field: str, unchecked: Callable[[Any], bool], doc: str) -> type:
    """The reference ``DDPConfig``, except that a ``field`` value for which ``unchecked`` holds is kept as given."""
    from dataclasses import dataclass

    from nemo_dist.distributed.config import DDPConfig as _ReferenceConfig

    @dataclass
    class DDPConfig(_ReferenceConfig):
        __doc__ = doc

        def __post_init__(self) -> None:
            given = getattr(self, field)
            kept = unchecked(given)
            if kept:
                setattr(self, field, None)  # every field of the reference accepts None or has a default to check
            super().__post_init__()
            if kept:
                setattr(self, field, given)  # the deliberate bug: kept unchecked

    return DDPConfig
