"""Layers 0 and 2: worlds checked side by side (lanes) report exactly what one world after another reports.

Layer 0 proves the pieces without a process group: how world sizes are dealt
into lanes, the in-order release of verdicts, warnings filed per thread.
Layer 2 runs the same checks in real gloo worlds of 1, 2 and 3 ranks, once in
lanes (the runner's own worlds) and once one world after another.
"""

from __future__ import annotations

import threading
import warnings

import pytest

from nemo_dist.conformance import REFERENCE, run_checks
from nemo_dist.conformance.engine.lanes import InOrder, deal, run_lanes
from nemo_dist.conformance.engine.thread_warnings import ThreadWarnings, ignoring, recording
from nemo_dist.conformance.engine.verdicts import Verdict
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance import _fake_checks as fake


def _verdict(name: str, size: int) -> Verdict:
    return Verdict(name, "gather", "core", size, "pass", 0.0, "")


@pytest.mark.parametrize(
    ("sizes", "lanes", "expected"),
    [
        ((1, 2, 3, 4), 2, [[3, 0], [2, 1]]),
        ((1, 2, 3, 4), 1, [[3, 2, 1, 0]]),
        ((2,), 2, [[0]]),
        ((4, 4, 1), 2, [[0, 2], [1]]),
        ((1, 2, 3, 4), 3, [[3], [2], [1, 0]]),
    ],
    ids=["four-sizes-two-lanes", "one-lane", "one-world", "equal-sizes", "three-lanes"],
)
def test_worlds_are_dealt_largest_first_to_the_lane_with_fewest_ranks(
    sizes: tuple[int, ...], lanes: int, expected: list[list[int]]
) -> None:
    """Each lane gets its worlds largest first; every world index appears exactly once."""
    assert deal(sizes, lanes) == expected


def test_verdicts_of_later_worlds_wait_until_every_earlier_world_is_done() -> None:
    """The first unfinished world's verdicts pass at once; the others' in world order once it is done."""
    seen: list[str] = []
    order = InOrder(3, lambda v: seen.append(v.check))
    order.callback(2)(_verdict("c", 3))
    order.callback(0)(_verdict("a1", 1))
    order.callback(1)(_verdict("b", 2))
    assert seen == ["a1"]
    order.done(2)
    assert seen == ["a1"]
    order.callback(0)(_verdict("a2", 1))
    order.done(0)
    assert seen == ["a1", "a2", "b"]
    order.callback(1)(_verdict("b2", 2))
    assert seen == ["a1", "a2", "b", "b2"]
    order.done(1)
    assert seen == ["a1", "a2", "b", "b2", "c"]


def test_each_thread_records_only_its_own_warnings() -> None:
    """Two threads recording at once each get exactly the warnings they raised, and ignoring drops them."""
    got: dict[str, list[str]] = {}
    both_recording = threading.Barrier(2)

    def warn(name: str) -> None:
        with recording() as caught:
            both_recording.wait()
            for n in range(3):
                warnings.warn(f"{name} {n}", UserWarning, stacklevel=1)
            both_recording.wait()
            with ignoring():
                warnings.warn(f"{name} ignored", UserWarning, stacklevel=1)
        got[name] = [str(w.message) for w in caught]

    with ThreadWarnings():
        threads = [threading.Thread(target=warn, args=(name,)) for name in ("left", "right")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert got == {"left": ["left 0", "left 1", "left 2"], "right": ["right 0", "right 1", "right 2"]}


def test_a_lane_that_raises_lets_the_other_lanes_finish_then_its_error_is_raised() -> None:
    """The error of one lane reaches the caller after every other lane ran all its worlds."""
    ran: list[int] = []

    def run_world(index: int, emit: object) -> None:
        if index == 1:
            raise ValueError("world 1 cannot start")
        ran.append(index)

    with pytest.raises(ValueError, match="world 1 cannot start"):
        run_lanes([[0, 2], [1, 3]], run_world, None, 4)
    assert sorted(ran) == [0, 2]


def test_checks_in_lanes_give_the_verdicts_of_one_world_after_another(world_factory: WorldFactory) -> None:
    """Verdicts, their order, the progress order and each verdict's own warnings are the same either way."""
    checks = [fake.PASSING, fake.WARNING, fake.FAILING, fake.SIZE_TWO_ONLY]
    progress: list[tuple[int, str]] = []
    in_lanes = run_checks(
        checks, REFERENCE, (1, 2, 3), max_examples=5, seed=7,
        on_verdict=lambda v: progress.append((v.world_size, v.check)),
    )
    one_by_one = run_checks(checks, REFERENCE, (1, 2, 3), max_examples=5, seed=7, worlds=world_factory)

    def summary(verdicts: tuple[Verdict, ...]) -> list[tuple[int, str, str, tuple[str, ...]]]:
        return [(v.world_size, v.check, v.outcome, v.warnings) for v in verdicts]

    assert summary(in_lanes.verdicts) == summary(one_by_one.verdicts)
    assert progress == [(v.world_size, v.check) for v in in_lanes.verdicts]
    assert [v.world_size for v in in_lanes.verdicts] == sorted(v.world_size for v in in_lanes.verdicts)
