"""The registry of conformance checks, shared by the CLI, ``pytest conformance/`` and ``tests/``.

A check is a parent-side function ``fn(world, impl)``: it draws inputs with
hypothesis, runs rank-side functions through ``world.run`` and asserts on the
per-rank results.  It raises ``AssertionError`` (or the harness's errors) when
the implementation breaks the contract, ``NotSupported`` when the
implementation lacks what the check needs, and ``NotApplicable`` when the
check cannot apply to what the implementation did.  A check registered with
``needs_world=False`` runs once, in the parent, with ``world`` None.  A ddp
check runs once per DDP entry point it exercises (``ddp_apis``) that the
module defines.

``world`` is anything with ``size``, ``backend`` and ``run(fn, *args, **kwargs)``
returning per-rank results in rank order: a ``nemo_dist.testing.World``, or
the in-world adapter used under torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from nemo_dist.conformance._impl import DDP_APIS, Implementation

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
    fn: Callable[[Any, Implementation], None]
    min_world: int = 1
    max_world: int | None = None
    #: False: the check needs no process group and runs once, in the parent.
    needs_world: bool = True
    #: For ddp checks: the entry points it exercises (each one the module defines gets a run).
    ddp_apis: tuple[str, ...] = DDP_APIS

    @property
    def description(self) -> str:
        """The first line of the check function's docstring."""
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]

    def applies_to(self, world_size: int) -> bool:
        """Whether this check runs in a world of ``world_size`` ranks (a world-less check: in none)."""
        if not self.needs_world:
            return False
        return world_size >= self.min_world and (self.max_world is None or world_size <= self.max_world)

    def variants(self, impl: Implementation) -> list[tuple[str, Implementation]]:
        """``(name, implementation)`` for each run of this check against ``impl``.

        One run for gather and config checks; a ddp check runs once per entry
        point of its ``ddp_apis`` that the module defines, named
        ``check[api]`` and pinned to that API. Empty when the module defines none of them.
        """
        if self.component != "ddp":
            return [(self.name, impl)]
        return [(f"{self.name}[{api}]", impl.with_ddp_api(api)) for api in impl.ddp_apis() if api in self.ddp_apis]

    def __call__(self, world: WorldLike | None, impl: Implementation) -> None:
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
    needs_world: bool = True,
    ddp_apis: tuple[str, ...] = DDP_APIS,
) -> Callable[[Callable[[Any, Implementation], None]], Check]:
    """Register the decorated function as the check ``name``; returns the ``Check``.

    Names are unique (a second registration raises ``ValueError``).
    """

    def register(fn: Callable[[Any, Implementation], None]) -> Check:
        if name in CHECKS:
            raise ValueError(f"conformance check {name!r} is registered twice")
        CHECKS[name] = Check(name, tier, component, fn, min_world, max_world, needs_world, ddp_apis)
        return CHECKS[name]

    return register
