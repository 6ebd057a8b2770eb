"""Layer 2: gloo worlds of 1 and 2 ranks. The runner turns what each check did into a verdict."""

from __future__ import annotations

import time
from typing import Any

import pytest

from nemo_dist.conformance import REFERENCE, Report, format_report, run_checks
from nemo_dist.conformance.engine.deadlines import Deadlines, DeadlineWorld, StepHung
from nemo_dist.conformance.engine.profile import changed_profile
from nemo_dist.conformance.engine.registry import thorough
from nemo_dist.testing import World
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance import _fake_checks as fake


@pytest.fixture(scope="module")
def report(world_factory: WorldFactory) -> Report:
    """One run of every fake check (the crashing one between two passing ones) in worlds of 1 and 2."""
    checks = [
        fake.PASSING,
        fake.FAILING,
        fake.NOT_SUPPORTED,
        fake.NOT_SUPPORTED_ON_RANKS,
        fake.CRASHING,
        fake.SIZE_TWO_ONLY,
    ]
    return run_checks(
        checks, REFERENCE, (1, 2), max_examples=20, worlds=world_factory
    )


def _outcomes(report: Report, size: int) -> dict[str, str]:
    return {v.check: v.outcome for v in report.verdicts if v.world_size == size}


def test_each_check_gets_one_verdict_per_world_size(report: Report) -> None:
    """Verdicts come per world size, then per check, in the order given."""
    assert [(v.world_size, v.check) for v in report.verdicts] == [
        (size, c) for size in (1, 2) for c in (
            "fake.passes", "fake.fails_under_hypothesis", "fake.not_supported",
            "fake.not_supported_on_ranks", "fake.crashes", "fake.size_two_only",
        )
    ]


def test_outcomes_follow_what_each_check_did(report: Report) -> None:
    """Pass, fail, not supported (parent or ranks), crash as fail, and size ranges as not applicable."""
    assert _outcomes(report, 1) == {
        "fake.passes": "pass",
        "fake.fails_under_hypothesis": "not applicable",
        "fake.not_supported": "not supported",
        "fake.not_supported_on_ranks": "not supported",
        "fake.crashes": "fail",
        "fake.size_two_only": "not applicable",
    }
    assert _outcomes(report, 2) == {
        "fake.passes": "pass",
        "fake.fails_under_hypothesis": "fail",
        "fake.not_supported": "not supported",
        "fake.not_supported_on_ranks": "not supported",
        "fake.crashes": "fail",
        "fake.size_two_only": "pass",
    }


def test_hypothesis_failure_keeps_the_shrunk_example(report: Report) -> None:
    """A failing property is reported with hypothesis's minimal example and the assertion message."""
    (verdict,) = [v for v in report.verdicts if v.check == "fake.fails_under_hypothesis" and v.world_size == 2]
    assert "x=0" in verdict.example
    assert verdict.message == "AssertionError: per-rank results [0, 1] differ from 0"


def test_a_crashed_rank_fails_its_check_and_the_next_check_gets_a_healthy_world(report: Report) -> None:
    """The dying rank is named with its exit code; the check after it passes in the replaced world."""
    (verdict,) = [v for v in report.verdicts if v.check == "fake.crashes" and v.world_size == 2]
    assert verdict.message.startswith("RankFailure: rank 1 crashed: exit code 3 running "), verdict.message
    assert verdict.example.startswith("Failing step (reported as it is, not shrunk: it left ranks stuck or dead)")
    assert _outcomes(report, 2)["fake.size_two_only"] == "pass"


def test_each_distinct_hypothesis_failure_is_shown_with_its_example_message_and_traceback(
    world_factory: WorldFactory,
) -> None:
    """Two distinct failures (an assertion here, a ValueError on the ranks): each with its own example and message."""
    report = run_checks([fake.TWO_WAYS], REFERENCE, (2,), max_examples=30, worlds=world_factory, seed=1)
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail"
    assert verdict.message.startswith("Hypothesis found 2 distinct failures"), verdict.message
    by_kind = {f.message.split(":")[0]: f for f in verdict.findings}
    assert set(by_kind) == {"AssertionError", "RankFailure"}, verdict.findings
    assert "x=0," in by_kind["AssertionError"].example
    assert by_kind["AssertionError"].message == "AssertionError: even number 0"
    raised = by_kind["RankFailure"]
    assert "x=1," in raised.example
    assert "rank 0 raised ValueError: odd number 1 on rank 0" in raised.message
    assert "_fake_checks.py\", line" in raised.traceback
    assert "in _raise_for_odd" in raised.traceback
    text = format_report(report)
    assert "[1 of 2]" in text
    assert "[2 of 2]" in text
    assert "AssertionError: even number 0" in text
    assert "ValueError: odd number 1 on rank 1" in text


@pytest.mark.parametrize("profile", [{}, {"derandomize": True, "database": None}], ids=["default", "derandomized"])
def test_a_seed_makes_hypothesis_draw_the_same_examples(profile: dict[str, Any]) -> None:
    """Two runs with one seed draw the same numbers; another seed draws others; the report records the seed.

    Whatever the active profile: under hypothesis's own CI profile (derandomized)
    a seed that changed nothing would make a failure's --seed reproduce nothing.
    """
    runs = []
    with changed_profile(**profile):
        for seed in (11, 11, 12):
            report = run_checks([fake.RECORDS_DRAWS], REFERENCE, (), max_examples=10, seed=seed)
            assert (report.seed, report.verdicts[0].outcome) == (seed, "pass")
            runs.append(list(fake.DRAWN))
    assert len(runs[0]) == 10
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_not_supported_reason_comes_from_the_ranks(report: Report) -> None:
    """A NotSupported raised on the ranks is reported with its reason and the ranks, not a traceback."""
    (verdict,) = [v for v in report.verdicts if v.check == "fake.not_supported_on_ranks" and v.world_size == 2]
    assert verdict.message == "NotSupported: this fork takes no uneven= keyword (rank 0, 1)"


def test_core_failure_makes_the_exit_code_one(report: Report) -> None:
    """A failing core check exits 1."""
    assert report.exit_code() == 1


def test_a_hung_check_is_a_hang_verdict_with_the_stacks_and_the_next_check_runs() -> None:
    """A check whose ranks hang gets HANG with the hung call and each rank's stack; the next check runs."""
    # A 1 s floor keeps the hang short; the 60 s cap leaves a slow (busy machine) step time to finish.
    with World(2, timeout=60.0) as world:
        report = run_checks(
            [fake.HANGING, fake.PASSING], REFERENCE, (2,), timeout=60.0, min_deadline=1.0, worlds=lambda size: world
        )
    hung, after = report.verdicts
    assert hung.outcome == "hang"
    assert hung.message.startswith("deadline 1 s: 10 x the slowest passing step so far")
    assert "rank 0 blocked: the same stack and no CPU time" in hung.message
    assert "rank 0 of 2 did not finish" in hung.message
    assert "in barrier" in hung.message
    assert hung.example == "Hung step: tests.conformance._fake_checks._rank_zero_waits_alone()"
    assert after.outcome == "pass"
    assert report.exit_code() == 1


def test_skip_test_from_a_check_is_skipped_not_failed(world_factory: WorldFactory) -> None:
    """A check raising unittest.SkipTest (an environment limit) is skipped with its reason; --strict ignores it."""
    report = run_checks(
        [fake.ENVIRONMENT_SKIP], REFERENCE, (1,), worlds=world_factory
    )
    (verdict,) = report.verdicts
    assert (verdict.outcome, verdict.message) == ("skipped", "needs a process outside any world")
    assert report.exit_code(strict=True) == 0


def test_world_less_checks_run_once_and_ddp_checks_once_per_entry_point(world_factory: WorldFactory) -> None:
    """A check needing no process group runs once (world size 0); a ddp check once per entry point, per size."""
    report = run_checks([fake.WORLDLESS, fake.BOTH_ENTRY_POINTS], REFERENCE, (1, 2), worlds=world_factory)
    assert [(v.check, v.world_size, v.outcome) for v in report.verdicts] == [
        ("fake.no_world", 0, "pass"),
        ("fake.entry_point[parallelize_ddp]", 1, "pass"),
        ("fake.entry_point[DDPManager]", 1, "pass"),
        ("fake.entry_point[parallelize_ddp]", 2, "pass"),
        ("fake.entry_point[DDPManager]", 2, "pass"),
    ]


def test_a_once_check_runs_in_the_smallest_world_it_fits_and_says_so_in_the_others(
    world_factory: WorldFactory,
) -> None:
    """A ``once`` check of sizes 2 and up, in a run of 1, 2 and 3: it runs at 2 only; 3 names the world it ran in."""
    report = run_checks([fake.ONCE], REFERENCE, (1, 2, 3), worlds=world_factory)
    assert [(v.world_size, v.outcome) for v in report.verdicts] == [
        (1, "not applicable"),
        (2, "pass"),
        (3, "not applicable"),
    ]
    assert report.verdicts[0].message == "runs in worlds of 2 or more ranks"
    assert report.verdicts[2].message.startswith("checked once per run, in the world of 2 ranks")
    (alone,) = run_checks([fake.ONCE], REFERENCE, (3,), worlds=world_factory).verdicts
    assert (alone.world_size, alone.outcome) == (3, "pass")  # the smallest selected world it fits


def test_a_sampled_check_is_thorough_in_the_world_of_one_and_the_smallest_larger_world_only(
    world_factory: WorldFactory,
) -> None:
    """A ``sampled`` check runs in every world; it samples only beyond the smallest world of 2 or more ranks."""
    report = run_checks([fake.SAMPLED], REFERENCE, (1, 2, 3), worlds=world_factory)
    assert [(v.world_size, v.message) for v in report.verdicts] == [
        (1, "AssertionError: thorough=True"),
        (2, "AssertionError: thorough=True"),
        (3, "AssertionError: thorough=False"),
    ]
    alone = run_checks([fake.SAMPLED], REFERENCE, (3, 2), worlds=world_factory).verdicts
    assert {(v.world_size, v.message) for v in alone} == {
        (2, "AssertionError: thorough=True"),  # the smallest selected world of 2 or more, whatever the order
        (3, "AssertionError: thorough=False"),
    }
    assert thorough(), "a check called outside a run is thorough"


def test_warnings_inside_a_check_are_recorded_once_and_never_fail_it(world_factory: WorldFactory) -> None:
    """Warnings raised by the parent or re-emitted from the ranks are in the verdict once each; the check passes."""
    (verdict,) = run_checks([fake.WARNING], REFERENCE, (2,), worlds=world_factory).verdicts
    assert verdict.outcome == "pass"
    assert verdict.warnings == ("DeprecationWarning: a deprecated entry point", "UserWarning: advice from a rank")


def test_step_deadline_is_ten_times_the_slowest_passing_step_within_floor_and_cap() -> None:
    """The deadline starts at the floor, follows 10 x the slowest passing step, and never passes the cap."""
    deadlines = Deadlines(cap_s=120)
    assert deadlines.current() == 10
    deadlines.passed(0.5)
    assert deadlines.current() == 10
    deadlines.passed(3.0)
    deadlines.passed(1.0)
    assert deadlines.current() == 30
    deadlines.passed(60.0)
    assert deadlines.current() == 120
    assert Deadlines(cap_s=4).current() == 4


def test_a_step_still_working_past_its_deadline_passes_and_leaves_the_deadline_alone(
    world_factory: WorldFactory,
) -> None:
    """A rank computing 3 CPU s past a 1 s deadline is slow, not hung: the step returns and is not the new measure."""
    from tests.testing import rank_fns

    deadlines = Deadlines(cap_s=60, floor_s=1)
    world = DeadlineWorld(world_factory(2), deadlines)
    assert world.run(rank_fns.wait_for_busy_rank, 1, 3.0) == [0, 1]
    assert deadlines.slowest_s == 0.0
    assert deadlines.current() == 1


def test_a_step_blocked_past_its_deadline_is_hung_within_seconds_saying_so(world_factory: WorldFactory) -> None:
    """A barrier one rank never joins is StepHung a few probes after its 1 s deadline, well before the 60 s cap."""
    from tests.testing import rank_fns

    ranks = world_factory(2)
    ranks.run(rank_fns.identity)  # started (and replaced, if an earlier test left it broken) before the clock
    world = DeadlineWorld(ranks, Deadlines(cap_s=60, floor_s=1))
    start = time.monotonic()
    with pytest.raises(StepHung) as info:
        world.run(rank_fns.hang_in_barrier, 1)
    assert time.monotonic() - start < 30
    assert "at least 1 s, at most --timeout 60 s" in info.value.deadline_note
    assert "rank 1 blocked: the same stack and no CPU time" in info.value.deadline_note
    assert "in barrier" in info.value.timeout.stacks[1]


def test_a_world_that_fails_to_start_is_started_once_and_each_check_says_why() -> None:
    """A world whose start fails is not relaunched per check: each check that applies FAILs naming the start error."""
    from tests.testing import rank_fns

    starts: list[int] = []

    class CountingWorld(World):
        def start(self, *, wait: bool = True) -> None:
            starts.append(1)
            super().start(wait=wait)

    with CountingWorld(2, timeout=60, setup=rank_fns.failing_setup) as world:
        checks = [fake.PASSING, fake.FAILING, fake.SIZE_TWO_ONLY]
        report = run_checks(checks, REFERENCE, (2,), max_examples=3, worlds=lambda size: world)
    assert len(starts) == 1
    assert [v.outcome for v in report.verdicts] == ["fail", "fail", "fail"]
    for v in report.verdicts:
        assert "the world of 2 ranks did not start, so this check did not run" in v.message
        assert "setup cannot run here" in v.message
    assert report.exit_code() == 1
