"""Layer 2: gloo worlds of 2 ranks. The torchrun adapter, exercised inside the ranks of a harness world.

Each harness rank plays a torchrun rank: it wraps the already initialised
default group in ``InWorld`` and runs checks there, so every rank draws,
runs and asserts by itself; the parent compares what the ranks report.
"""

from __future__ import annotations

from typing import Any

import pytest

from nemo_dist.conformance import REFERENCE, Verdict
from nemo_dist.conformance.frontends.inworld import InWorld, run_in_world
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance import _fake_checks as fake


def _square(x: int) -> int:
    import torch.distributed as dist

    return x * x + dist.get_rank()


def _raise_on_rank_one() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one disagrees")
    return 0


def _other() -> int:
    return 1


def _run_adapter(kind: str) -> Any:
    """Rank side: one ``InWorld.run`` call of the given kind; return its result or the error it raised."""
    import torch.distributed as dist

    world = InWorld("gloo")
    try:
        if kind == "square":
            return world.run(_square, 3)
        if kind == "raise":
            return world.run(_raise_on_rank_one)
        fn = _square if dist.get_rank() == 0 else _other
        return world.run(fn, 3)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _run_fake_checks() -> list[Verdict]:
    """Rank side: run the fake checks in this world like the torchrun mode does."""
    checks = [fake.PASSING, fake.FAILING, fake.NOT_SUPPORTED_ON_RANKS, fake.SIZE_TWO_ONLY]
    return list(run_in_world(checks, REFERENCE, backend="gloo", tier="all", max_examples=20).verdicts)


def test_run_returns_every_ranks_result_in_rank_order(world_factory: WorldFactory) -> None:
    """Each rank gets the list of all ranks' results, like World.run in the parent."""
    assert world_factory(2).run(_run_adapter, "square") == [[9, 10], [9, 10]]


def test_a_rank_that_raises_makes_every_rank_raise_naming_it(world_factory: WorldFactory) -> None:
    """When rank 1 raises, both ranks get a RankFailure naming rank 1 and its error."""
    results = world_factory(2).run(_run_adapter, "raise")
    for text in results:
        assert text.startswith("RankFailure: 1 of 2 rank(s) failed")
        assert "rank 1 raised ValueError: rank one disagrees" in text


def test_ranks_running_different_functions_raise_lockstep_error(world_factory: WorldFactory) -> None:
    """Ranks that call different functions at the same step both stop with LockstepError naming each side."""
    results = world_factory(2).run(_run_adapter, "diverge")
    for text in results:
        assert text.startswith("LockstepError: ranks diverged")
        assert "_square" in text
        assert "_other" in text


@pytest.fixture(scope="module")
def rank_verdicts(world_factory: WorldFactory) -> list[list[Verdict]]:
    """The verdicts each rank reached running the fake checks in the adapter."""
    return world_factory(2).run(_run_fake_checks)


def test_every_rank_reaches_the_same_verdicts_and_example(rank_verdicts: list[list[Verdict]]) -> None:
    """Derandomized hypothesis draws and shrinks in lockstep: both ranks report the same outcomes and example."""
    first, second = ([(v.check, v.outcome, v.message, v.example) for v in verdicts] for verdicts in rank_verdicts)
    assert first == second
    assert [(c, o) for c, o, _, _ in first] == [
        ("fake.passes", "pass"),
        ("fake.fails_under_hypothesis", "fail"),
        ("fake.not_supported_on_ranks", "not supported"),
        ("fake.size_two_only", "pass"),
    ]
    failing = first[1]
    assert "x=0" in failing[3]


def test_checks_outside_their_world_size_are_not_applicable_under_torchrun(world_factory: WorldFactory) -> None:
    """In a world of 1, checks needing 2 ranks are not applicable, not failed."""
    verdicts = world_factory(1).run(_run_fake_checks)[0]
    assert [(v.check, v.outcome) for v in verdicts] == [
        ("fake.passes", "pass"),
        ("fake.fails_under_hypothesis", "not applicable"),
        ("fake.not_supported_on_ranks", "not supported"),
        ("fake.size_two_only", "not applicable"),
    ]
