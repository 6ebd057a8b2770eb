"""Harness layer 1 (real gloo worlds): a call past its deadline is hung only when its ranks are blocked.

``World.run_patiently`` probes the unfinished ranks once a second after the
deadline (stack dumps on SIGUSR1, written by a sampler thread of the rank;
CPU time and state from ``/proc``). These tests plant a rank that computes
past the deadline (slow, not stuck), one blocked in a barrier nobody joins
(stuck) and one that computes past the limit, and check what each call
reports and how soon; and that probes never crash a rank.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest

from nemo_dist.testing import RankFailure, World, WorldTimeout
from nemo_dist.testing._stack_sampler import PROBE_SIGNAL
from nemo_dist.testing.progress import PROBE_INTERVAL_S, proc_stat
from tests.testing import rank_fns

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="progress probes read /proc (Linux)")

#: Probes needed after the deadline before a blocked rank is judged: two dumps an interval apart, plus one.
_PROBES_TO_JUDGE = 3


@pytest.fixture(scope="module")
def world2() -> Iterator[World]:
    """A 2-rank world shared by this module's tests (replaced after a timeout)."""
    with World(2, timeout=60.0, grace=1.0) as w:
        w.run(rank_fns.identity)
        yield w


def test_rank_computing_past_its_deadline_is_given_time_and_finishes(world2: World) -> None:
    """A rank computing for 3 CPU s while the other waits in a barrier outlives a 1 s deadline without a timeout."""
    assert world2.run_patiently(1.0, 60.0, rank_fns.wait_for_busy_rank, 1, 3.0) == [0, 1]


def test_rank_waiting_on_a_working_subprocess_is_given_time_and_finishes(world2: World) -> None:
    """A rank asleep in ``subprocess.run`` while its child computes for 3 CPU s (torch's compiler) is working, not
    blocked: the child's CPU time counts as the rank's, and the call outlives a 1 s deadline."""
    assert world2.run_patiently(1.0, 60.0, rank_fns.wait_for_busy_subprocess, 1, 3.0) == [0, 1]


def test_rank_still_computing_when_another_failed_answers_past_the_grace(world2: World) -> None:
    """Rank 0 raises at once, rank 1 computes 3 CPU s (past the 1 s grace) and then raises the same: the failure
    shows both ranks' exceptions, not rank 1 as one that did not answer."""
    with pytest.raises(RankFailure) as info:
        world2.run_patiently(1.0, 60.0, rank_fns.refuse_after_computing, 1, 3.0)
    assert sorted(info.value.failures) == [0, 1]
    for rank in (0, 1):
        assert "raised ValueError: refused alike" in info.value.failures[rank], info.value.failures[rank]


def test_rank_blocked_in_a_collective_times_out_soon_after_the_deadline(world2: World) -> None:
    """A barrier nobody else joins is a WorldTimeout within the deadline plus a few probes, saying it is blocked."""
    start = time.monotonic()
    with pytest.raises(WorldTimeout) as info:
        world2.run_patiently(1.0, 60.0, rank_fns.hang_in_barrier, 1)
    waited = time.monotonic() - start
    assert set(info.value.stacks) == {1}
    assert "in barrier" in info.value.stacks[1]
    assert info.value.reason.startswith("rank 1 blocked: the same stack and no CPU time")
    # The limit is 60 s; the judgement needs a few probe intervals. The bound
    # is loose (a loaded machine), far below the limit.
    assert waited < 1.0 + _PROBES_TO_JUDGE * PROBE_INTERVAL_S + 15.0
    assert world2.run(rank_fns.identity)[1][0] == 1


def test_rank_still_computing_at_the_limit_times_out_at_the_limit(world2: World) -> None:
    """A rank that computes for longer than the limit is a WorldTimeout saying it was still working."""
    with pytest.raises(WorldTimeout) as info:
        world2.run_patiently(1.0, 3.0, rank_fns.compute_for, 120.0)
    assert set(info.value.stacks) == {0, 1}
    assert info.value.reason.startswith("still working at the 3 s limit")
    assert world2.run(rank_fns.identity)[0][0] == 0


def test_run_with_deadline_is_not_patient(world2: World) -> None:
    """The plain deadline call does not wait for a working rank: the strict contract is unchanged."""
    with pytest.raises(WorldTimeout) as info:
        world2.run_with_deadline(1.0, rank_fns.compute_for, 120.0)
    assert info.value.reason == ""


def test_limit_below_the_deadline_is_rejected(world2: World) -> None:
    """run_patiently names the bad limit instead of starting a call."""
    with pytest.raises(ValueError, match=r"limit_s must be >= deadline_s \(2 s\), got 1"):
        world2.run_patiently(2, 1, rank_fns.identity)


def test_stack_probes_never_crash_a_rank_whose_threads_come_and_go(world2: World) -> None:
    """Hundreds of probes (SIGUSR1) a second while a rank churns threads: the call returns, no rank replaced.

    A dump written inside the signal handler (faulthandler's) crashed such a
    rank with SIGSEGV within a few dozen probes.
    """
    world2.run(rank_fns.identity)  # ranks up (an earlier test's timeout replaces them lazily)
    pids = world2.pids
    assert len(pids) == 2
    sent = [0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # a crashed rank: the call reports it
                    os.kill(pid, PROBE_SIGNAL)
            sent[0] += 1
            stop.wait(0.002)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        started = world2.run(rank_fns.churn_threads, 3.0)
    finally:
        stop.set()
        prober.join()
    assert sent[0] > 100
    assert all(n > 0 for n in started), started
    assert world2.pids == pids


def test_proc_stat_reads_this_process() -> None:
    """The running process is in state R and its CPU seconds grow while it computes."""
    before = proc_stat(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = proc_stat(os.getpid())
    assert before is not None
    assert after is not None
    assert after.state == "R"
    assert after.cpu_s - before.cpu_s >= 0.1
