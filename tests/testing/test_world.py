"""Harness layer 1 (real gloo worlds): results, faults, recovery, cleanup.

Each fault test plants one failure (raise, hang, exit, signal, import error)
in a real World, checks the report, then checks the next run is healthy.
Deadlines and grace periods are short so the file runs in seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from multiprocessing.connection import wait
from pathlib import Path

import pytest
import torch

from nemo_dist.testing import RankFailure, World, WorldTimeout
from nemo_dist.testing.launcher import rank_start_method
from tests.testing import rank_fns

SIZE = 3


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One 3-rank gloo world shared by this module's tests (replaced after faults)."""
    with World(SIZE, timeout=30.0, grace=1.0) as w:
        yield w


@pytest.fixture(scope="module")
def world2() -> Iterator[World]:
    """A 2-rank world for the faults that replace the world (cheaper restarts)."""
    with World(2, timeout=30.0, grace=1.0) as w:
        yield w


def _assert_healthy(world: World) -> None:
    assert world.run(rank_fns.all_gather_ranks) == [list(map(float, range(world.size)))] * world.size


def test_run_returns_each_rank_result_in_rank_order(world: World) -> None:
    """run calls fn on every rank with an initialised group, results in rank order."""
    results = world.run(rank_fns.identity)
    for rank, (r, size, threads, env) in enumerate(results):
        assert (r, size, threads) == (rank, SIZE, 1)
        assert env == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(SIZE)}


def test_arguments_and_tensor_results_travel_by_value(world: World) -> None:
    """Positional/keyword arguments arrive intact; tensors come back by value."""
    assert world.run(rank_fns.echo, 1, "a", k=[2]) == [((1, "a"), {"k": [2]})] * SIZE
    base = torch.arange(3.0)
    results = world.run(rank_fns.add_rank, base)
    for rank, t in enumerate(results):
        assert torch.equal(t, base + rank)
    assert torch.equal(base, torch.arange(3.0))


def test_rank_warning_is_reemitted_once_under_the_parents_filters(world: World) -> None:
    """A warning from ranks' calls reaches the parent once, with its class, where pytest's filters judge it."""
    with pytest.warns(rank_fns.PlantedWarning, match="planted warning from a rank") as record:
        assert world.run(rank_fns.warn_on, list(range(SIZE))) == list(range(SIZE))
    planted = [w for w in record if issubclass(w.category, rank_fns.PlantedWarning)]
    assert len(planted) == 1
    assert planted[0].filename.endswith("rank_fns.py")


def test_rank_warning_fails_a_run_under_warnings_as_errors(world: World) -> None:
    """With warnings as errors in the parent, a rank's warning raises from run; the world stays healthy."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(rank_fns.PlantedWarning, match="planted warning from a rank"):
            world.run(rank_fns.warn_on, [1])
    _assert_healthy(world)


def test_rank_raising_reports_its_rank_and_traceback(world: World) -> None:
    """One rank raising gives RankFailure naming it with its child traceback; world kept."""
    world.start()  # pids of running ranks, whatever ran before
    pids = world.pids
    with pytest.raises(RankFailure) as info:
        world.run(rank_fns.raise_on, [1])
    assert set(info.value.failures) == {1}
    assert "rank 1 raised ValueError: planted failure on rank 1" in str(info.value)
    assert 'rank_fns.py", line' in info.value.failures[1]
    assert info.value.returned == {0: 0, 2: 2}
    assert world.pids == pids
    _assert_healthy(world)


def test_every_raising_rank_is_named(world: World) -> None:
    """All failing ranks are reported, not just the first."""
    with pytest.raises(RankFailure) as info:
        world.run(rank_fns.raise_on, [0, 2])
    assert set(info.value.failures) == {0, 2}
    for rank in (0, 2):
        assert f"rank {rank} raised ValueError: planted failure on rank {rank}" in str(info.value)
    _assert_healthy(world)


def test_all_ranks_raising_keeps_the_world(world: World) -> None:
    """When every rank raised, the world passes its barrier check and is kept."""
    world.start()  # pids of running ranks, whatever ran before
    pids = world.pids
    with pytest.raises(RankFailure) as info:
        world.run(rank_fns.raise_on, list(range(SIZE)))
    assert set(info.value.failures) == set(range(SIZE))
    assert world.pids == pids
    _assert_healthy(world)


def test_ranks_stuck_after_a_failure_are_dumped(world2: World) -> None:
    """A rank raising while the others wait in all_reduce: all reported, with stacks."""
    with pytest.raises(RankFailure) as info:
        world2.run(rank_fns.raise_then_others_wait, 0)
    assert "rank 0 raised KeyError" in str(info.value)
    text = info.value.failures[1]
    assert text.startswith("rank 1 did not answer")
    assert "all_reduce" in text
    _assert_healthy(world2)


def test_hang_in_barrier_times_out_with_every_stack(world2: World) -> None:
    """A rank hung in dist.barrier() gives WorldTimeout with 'barrier' in its stack."""
    with pytest.raises(WorldTimeout) as info:
        world2.run_with_deadline(1.5, rank_fns.hang_in_barrier, 1)
    assert set(info.value.stacks) == {1}
    assert "in barrier" in info.value.stacks[1]
    assert "hang_in_barrier" in str(info.value)
    assert "did not finish within 1.5 s" in str(info.value)
    _assert_healthy(world2)


def test_os_exit_is_reported_with_its_exit_code(world2: World) -> None:
    """os._exit(7) on a rank is reported as 'exit code 7' with its stderr tail; the world is replaced."""
    old = world2.pids
    with pytest.raises(RankFailure) as info:
        world2.run(rank_fns.exit_with, 1, 7)
    assert info.value.failures[1].startswith("rank 1 died: exit code 7")
    assert "last words of rank 1" in info.value.failures[1]  # the tail of its stderr
    _assert_healthy(world2)
    assert not set(world2.pids) & set(old)


def test_sigkill_is_reported_with_the_signal_name(world2: World) -> None:
    """A rank killed by SIGKILL is reported as 'killed by signal SIGKILL'."""
    with pytest.raises(RankFailure) as info:
        world2.run(rank_fns.kill_self, 0)
    assert info.value.failures[0].startswith("rank 0 died: killed by signal SIGKILL")
    _assert_healthy(world2)


def test_function_not_importable_in_rank_reports_import_error(world: World) -> None:
    """A function whose module only exists in the parent fails on every rank with the ImportError."""
    module = types.ModuleType("nemo_dist_ghost_module")

    def ghost() -> int:
        return 0

    ghost.__module__ = module.__name__
    ghost.__qualname__ = "ghost"
    module.ghost = ghost  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    world.start()  # pids of running ranks, whatever ran before
    pids = world.pids
    try:
        with pytest.raises(RankFailure) as info:
            world.run(ghost)
    finally:
        del sys.modules[module.__name__]
    assert set(info.value.failures) == set(range(SIZE))
    assert "ModuleNotFoundError: No module named 'nemo_dist_ghost_module'" in str(info.value)
    assert world.pids == pids
    _assert_healthy(world)


def test_unpicklable_result_is_reported(world: World) -> None:
    """A return value that cannot be pickled is a RankFailure, not a hang."""
    with pytest.raises(RankFailure, match="could not be pickled"):
        world.run(rank_fns.unpicklable_result)
    _assert_healthy(world)


def test_world_of_one_rank() -> None:
    """A world of size 1 runs collectives in a gloo group of one."""
    with World(1, timeout=30.0) as w:
        assert w.run(rank_fns.all_gather_ranks, 0.5) == [[0.5]]
        assert w.run(rank_fns.identity)[0][:2] == (0, 1)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_close_leaves_no_process_temp_dir_or_port() -> None:
    """After close no rank process, temp dir or store listening socket remains."""
    w = World(2, timeout=30.0)
    _assert_healthy(w)
    pids, tmpdir, port = w.pids, w.tmpdir, w._store.port
    assert tmpdir is not None
    assert tmpdir.exists()
    w.close()
    assert all(_pid_gone(p) for p in pids)
    assert not Path(tmpdir).exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


_ORPHAN_SCRIPT = """
import os
from nemo_dist.testing import World
from tests.testing import rank_fns
w = World(2, timeout=30.0)
parents = {got[0] for got in w.run(rank_fns.origin, "HOME")} - {os.getpid()}  # the fork server, if any
print(" ".join(map(str, [*w.pids, *parents])), flush=True)
os._exit(0)
"""


def test_ranks_die_with_their_parent(tmp_path: Path) -> None:
    """Ranks of a parent that exits without close() die too, and so does the fork server they came from."""
    # A parent killed abruptly cannot remove its World's temp dir: keep it in tmp_path.
    out = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    pids = [int(p) for p in out.stdout.split()]
    # The ranks, and the fork server they were forked from (none where ranks are executed afresh).
    assert len(pids) == (3 if rank_start_method() == "forkserver" else 2), pids
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    try:
        deadline_ok = all(wait([fd], 10.0) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert deadline_ok, f"rank processes {pids} outlived their parent"


def test_setup_runs_once_per_rank_before_the_first_call_even_after_a_background_start() -> None:
    """start(wait=False) launches the ranks and returns; setup has run on each rank, once, by the first call."""
    with World(2, setup=rank_fns.remember_setup) as world:
        world.start(wait=False)
        assert len(world.pids) == 2
        assert world.run(rank_fns.setup_record) == [[0], [1]]
        assert world.run(rank_fns.setup_record) == [[0], [1]]


def test_a_failing_setup_fails_the_start_naming_the_rank() -> None:
    """A setup that raises on one rank makes the start a RankFailure naming that rank and its error."""
    with World(2, setup=rank_fns.failing_setup) as world, pytest.raises(RankFailure) as info:
        world.run(rank_fns.identity)
    assert "rank 1 raised RuntimeError: setup cannot run here" in str(info.value)
    assert world.pids == []

