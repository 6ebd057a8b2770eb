"""Layer 2: gloo worlds of 2 and 3 ranks. The gather checks fail on broken forks and pass an independent one.

Each broken fork in ``tests/forks/`` carries one deliberate bug; the check that
guards against it must raise ``AssertionError`` with a message that names the
broken property. ``tests/forks/independent_gather.py``, written from the SPEC
without nemo_dist code, must pass every gather check, so the checks prove the
contract and not the reference's own implementation.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nemo_dist.conformance import gather_checks
from nemo_dist.conformance._impl import Implementation, NotSupported
from nemo_dist.conformance._registry import CHECKS, Check
from nemo_dist.testing.plugin import WorldFactory


def _fork(name: str) -> Implementation:
    return Implementation(gather=f"tests.forks.{name}", ddp=None, config=None)


BROKEN: list[tuple[str, Check, str]] = [
    ("broken_gather_no_cross_rank_sum", gather_checks.backward_sums_rank_slices, "gradient of x"),
    ("broken_gather_wrong_order", gather_checks.forward_matches_cat, "gathered output: values differ"),
    ("broken_gather_mutates_grad", gather_checks.inputs_and_grads_not_modified, "modified in place"),
    ("broken_gather_uneven_hangs_or_garbage", gather_checks.uneven_mismatch_raises_on_every_rank, "ValueError"),
]


@pytest.mark.parametrize(("fork", "guard", "message"), BROKEN, ids=[name for name, _, _ in BROKEN])
def test_guarding_check_fails_on_broken_fork(
    world_factory: WorldFactory, fork: str, guard: Callable[..., None], message: str
) -> None:
    """The check guarding against the fork's bug raises AssertionError naming the broken property."""
    with pytest.raises(AssertionError, match=message):
        guard(world_factory(2), _fork(fork))


def _world_size_for(check: Check) -> int:
    """3 ranks (room for two groups and uneven rows) where the check applies, else its smallest world."""
    return 3 if check.applies_to(3) else check.min_world


GATHER_CHECKS = [c for c in CHECKS.values() if c.component == "gather"]


@pytest.mark.parametrize("check", GATHER_CHECKS, ids=[c.name for c in GATHER_CHECKS])
def test_independent_fork_passes_every_gather_check(world_factory: WorldFactory, check: Check) -> None:
    """A correct fork written from the SPEC alone passes every gather check (in a world of 3, or 1 for w1 checks)."""
    check(world_factory(_world_size_for(check)), _fork("independent_gather"))


@pytest.mark.parametrize(
    "check",
    [gather_checks.uneven_gathers_rows_in_rank_order, gather_checks.group_uses_group_ranks],
    ids=["uneven", "group"],
)
def test_extended_checks_report_missing_keyword_as_not_supported(world_factory: WorldFactory, check: Check) -> None:
    """A fork whose all_gather_with_grad lacks uneven=/group= gets NotSupported, not a failure."""
    with pytest.raises(NotSupported, match=r"takes no (uneven|group)= keyword"):
        check(world_factory(3), _fork("upstream_style_gather"))
