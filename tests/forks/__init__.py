"""Implementations the conformance tests check (data): broken, independent, upstream-faithful and gallery forks.

Most broken forks are the bundled reference with one thing wrong. The
helpers here build the common cases: a manager that hands ``parallelize_ddp``
a changed config, a config that keeps one field's bad value unchecked, and
both FSDP2 entry points around a changed ``_parallelize``. They import the
reference only when called, so importing an independent fork imports no
nemo_dist code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["config_keeping", "fsdp2_fork", "manager_changing_config"]


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


def fsdp2_fork(parallelize: Callable[[Any, Any, Any, Any], Any], doc: str) -> tuple[type, Callable[..., Any]]:
    """The reference ``FSDP2Manager`` and ``fsdp2_strategy_parallelize``, both sharding through ``parallelize``.

    ``parallelize(model, config, device_mesh, reapply_trainability)`` stands in
    for the reference's ``_parallelize`` (the fork's deliberate bug lives
    there); ``doc`` says how it differs and becomes the manager's docstring.
    The functional entry point takes the reference's parameters (its
    signature is reported as the reference's) and builds its ``FSDP2Config``
    with the reference's own ``_strategy_config`` (the same errors). Returns ``(FSDP2Manager,
    fsdp2_strategy_parallelize)``.
    """
    import inspect

    from nemo_dist.distributed import fsdp2 as reference

    class FSDP2Manager(reference.FSDP2Manager):
        __doc__ = doc

        def parallelize(self, model: Any, reapply_trainability: Any = None) -> Any:
            """Shard ``model`` through the fork's ``parallelize`` (the deliberate bug)."""
            return parallelize(model, self.config, self.device_mesh, reapply_trainability)

    signature = inspect.signature(reference.fsdp2_strategy_parallelize)

    def fsdp2_strategy_parallelize(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        keywords = dict(bound.arguments)
        model, device_mesh = keywords.pop("model"), keywords.pop("device_mesh")
        reapply_trainability = keywords.pop("reapply_trainability")
        return parallelize(model, reference._strategy_config(**keywords), device_mesh, reapply_trainability)

    fsdp2_strategy_parallelize.__doc__ = f"The reference's functional entry point, sharding as the fork's manager. {doc}"
    fsdp2_strategy_parallelize.__signature__ = signature  # type: ignore[attr-defined]
    return FSDP2Manager, fsdp2_strategy_parallelize
