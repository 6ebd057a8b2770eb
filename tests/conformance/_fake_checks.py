"""Fake conformance checks that exercise the runner: pass, fail (one way or two), not supported, crash.

They are plain ``Check`` objects, not registered in ``CHECKS``; rank-side
functions are module-level so a World can run them.
"""

from __future__ import annotations

import os
import unittest
import warnings

from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.conformance import Check, Implementation, NotSupported, WorldLike
from nemo_dist.conformance.engine.registry import thorough

__all__ = [
    "BOTH_ENTRY_POINTS",
    "CRASHING",
    "DRAWN",
    "ENVIRONMENT_SKIP",
    "FAILING",
    "HANGING",
    "NOT_SUPPORTED",
    "NOT_SUPPORTED_ON_RANKS",
    "ONCE",
    "PASSING",
    "RECORDS_DRAWS",
    "SAMPLED",
    "SIZE_TWO_ONLY",
    "TWO_WAYS",
    "WARNING",
    "WORLDLESS",
]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _plus_rank(x: int) -> int:
    return x + _rank()


def _raise_not_supported() -> None:
    raise NotSupported("this fork takes no uneven= keyword")


def _die_on_last_rank() -> int:
    import torch.distributed as dist

    if dist.get_rank() == dist.get_world_size() - 1:
        os._exit(3)
    return 0


def _rank_zero_waits_alone() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.barrier()  # the other ranks never join: a hang
    return 0


def _environment_skip(world: WorldLike, impl: Implementation) -> None:
    """The environment cannot run this check (not the implementation's fault)."""
    raise unittest.SkipTest("needs a process outside any world")


def _passing(world: WorldLike, impl: Implementation) -> None:
    """Every rank reports its own rank number."""
    assert world.run(_rank) == list(range(world.size))


def _failing(world: WorldLike, impl: Implementation) -> None:
    """Every rank returns the drawn number unchanged (false on rank 1 and up)."""

    @given(st.integers(min_value=0, max_value=1000))
    def prop(x: int) -> None:
        results = world.run(_plus_rank, x)
        assert results == [x] * world.size, f"per-rank results {results} differ from {x}"

    prop()


def _raise_for_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd number {x} on rank {_rank()}")
    return x


def _two_ways(world: WorldLike, impl: Implementation) -> None:
    """Even numbers fail an assertion here; odd ones make every rank raise ValueError: two distinct failures."""

    @given(st.integers(min_value=0, max_value=1000))
    def prop(x: int) -> None:
        assert x % 2, f"even number {x}"
        world.run(_raise_for_odd, x)

    prop()


#: What the last run of RECORDS_DRAWS drew, in order.
DRAWN: list[int] = []


def _records_draws(world: object, impl: Implementation) -> None:
    """Passes; records every number hypothesis draws (to compare runs with a seed)."""
    DRAWN.clear()

    @given(st.integers(min_value=0, max_value=10**9))
    def prop(x: int) -> None:
        DRAWN.append(x)

    prop()


def _not_supported(world: WorldLike, impl: Implementation) -> None:
    """The parent finds the feature missing."""
    raise NotSupported("this fork takes no group= keyword")


def _not_supported_on_ranks(world: WorldLike, impl: Implementation) -> None:
    """Every rank finds the feature missing."""
    world.run(_raise_not_supported)


def _crashing(world: WorldLike, impl: Implementation) -> None:
    """The last rank dies with exit code 3."""
    world.run(_die_on_last_rank)


def _hanging(world: WorldLike, impl: Implementation) -> None:
    """Rank 0 waits in a barrier no other rank joins."""
    world.run(_rank_zero_waits_alone)


def _warn_on_rank() -> int:
    warnings.warn("advice from a rank", UserWarning, stacklevel=1)
    return 0


def _warning(world: WorldLike, impl: Implementation) -> None:
    """The ranks and the parent each warn once per call; the check passes."""
    warnings.warn("a deprecated entry point", DeprecationWarning, stacklevel=1)
    world.run(_warn_on_rank)
    world.run(_warn_on_rank)


def _no_world(world: object, impl: Implementation) -> None:
    """Needs no process group: gets no world."""
    assert world is None, f"a world-less check got {world!r}"


def _entry_point(world: WorldLike, impl: Implementation) -> None:
    """Pinned to one DDP entry point of the bundled module."""
    assert impl.ddp_api in ("parallelize_ddp", "DDPManager"), impl.ddp_api


def _says_if_thorough(world: WorldLike, impl: Implementation) -> None:
    """Fails, saying whether the run asked for the whole matrix: a verdict message a test can read."""
    raise AssertionError(f"thorough={thorough()}")


PASSING = Check("fake.passes", "core", "gather", _passing)
FAILING = Check("fake.fails_under_hypothesis", "core", "gather", _failing, min_world=2)
TWO_WAYS = Check("fake.fails_two_ways", "core", "gather", _two_ways)
NOT_SUPPORTED = Check("fake.not_supported", "extended", "gather", _not_supported)
NOT_SUPPORTED_ON_RANKS = Check("fake.not_supported_on_ranks", "extended", "gather", _not_supported_on_ranks)
CRASHING = Check("fake.crashes", "core", "gather", _crashing)
HANGING = Check("fake.hangs", "core", "gather", _hanging, min_world=2)
ENVIRONMENT_SKIP = Check("fake.environment_skip", "core", "gather", _environment_skip)
SIZE_TWO_ONLY = Check("fake.size_two_only", "core", "config", _passing, min_world=2, max_world=2)
ONCE = Check("fake.once", "core", "config", _passing, min_world=2, once=True)
SAMPLED = Check("fake.sampled", "core", "config", _says_if_thorough, sampled=True)
WARNING = Check("fake.warns", "core", "gather", _warning)
WORLDLESS = Check("fake.no_world", "core", "config", _no_world, needs_world=False)
RECORDS_DRAWS = Check("fake.records_draws", "core", "config", _records_draws, needs_world=False)
BOTH_ENTRY_POINTS = Check("fake.entry_point", "core", "ddp", _entry_point)
