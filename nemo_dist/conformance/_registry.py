"""The registry of conformance checks, shared by the CLI, ``pytest conformance/`` and ``tests/``.

A check is a parent-side function ``fn(world, impl)``: it draws inputs with
hypothesis, runs rank-side functions through ``world.run`` and asserts on the
per-rank results.  It raises ``AssertionError`` (or the harness's errors) when
the implementation breaks the contract, and ``NotSupported`` when the
implementation lacks what the check needs.

``world`` is anything with ``size``, ``backend`` and ``run(fn, *args, **kwargs)``
returning per-rank results in rank order: a ``nemo_dist.testing.World``, or
the in-world adapter used under torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from nemo_dist.conformance._impl import Implementation

__all__ = ["CHECKS", "Check", "WorldLike", "check"]

Tier = Literal["core", "extended"]
Component = Literal["gather", "ddp", "config"]


class WorldLike(Protocol):
    """What a check needs of a world."""

    @property
    def size(self) -> int: ...

    @property
    def backend(self) -> str: ...

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]: ...


@dataclass(frozen=True)
class Check:
    """One named property of the contract, runnable against any implementation."""

    name: str
    tier: Tier
    component: Component
    fn: Callable[[WorldLike, Implementation], None]
    min_world: int = 1
    max_world: int | None = None

    @property
    def description(self) -> str:
        """The first line of the check function's docstring."""
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]

    def applies_to(self, world_size: int) -> bool:
        """Whether this check runs in a world of ``world_size`` ranks."""
        return world_size >= self.min_world and (self.max_world is None or world_size <= self.max_world)

    def __call__(self, world: WorldLike, impl: Implementation) -> None:
        self.fn(world, impl)


#: Every registered check by name, in registration order.
CHECKS: dict[str, Check] = {}


def check(
    name: str,
    *,
    tier: Tier,
    component: Component,
    min_world: int = 1,
    max_world: int | None = None,
) -> Callable[[Callable[[WorldLike, Implementation], None]], Check]:
    """Register the decorated function as the check ``name``; returns the ``Check``.

    Names are unique (a second registration raises ``ValueError``).
    """

    def register(fn: Callable[[WorldLike, Implementation], None]) -> Check:
        if name in CHECKS:
            raise ValueError(f"conformance check {name!r} is registered twice")
        CHECKS[name] = Check(name, tier, component, fn, min_world, max_world)
        return CHECKS[name]

    return register
