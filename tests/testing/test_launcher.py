"""Harness layer 1 (real gloo worlds): how ranks start, forked from the fork server or executed afresh.

Every World of this process forks its ranks from a fork server that
imported torch once (:mod:`nemo_dist.testing.launcher`); a rank still gets
this process's environment of the moment, and ranks whose environment
differs in what torch reads when it starts come from a server started so.
Exit statuses, deaths and hangs through the server are the fault tests' of
``test_world.py``; dying with the parent is there too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nemo_dist.testing import World
from nemo_dist.testing.launcher import RANK_START_ENV, rank_start_method
from tests.testing import rank_fns

_MARK = "NEMO_DIST_TEST_LAUNCHER_MARK"


def _parent_of(pid: int) -> int:
    """The parent pid of process ``pid`` (Linux: /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture(autouse=True)
def _forkserver_here(monkeypatch: pytest.MonkeyPatch) -> None:
    if rank_start_method() != "forkserver":
        pytest.skip(f"ranks are executed afresh here ({RANK_START_ENV} or no os.fork)")
    monkeypatch.delenv(RANK_START_ENV, raising=False)


def test_every_world_forks_its_ranks_from_one_fork_server_child_of_this_process() -> None:
    """The ranks of two worlds share one parent, the fork server, itself a child of this process."""
    with World(2) as two, World(3) as three:
        parents = {got[0] for world in (two, three) for got in world.run(rank_fns.origin, _MARK)}
    assert len(parents) == 1, parents
    (server,) = parents
    assert server != os.getpid()
    assert _parent_of(server) == os.getpid()


def test_a_forked_rank_takes_this_processs_environment_of_the_moment_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A variable set after the fork server started reaches the ranks of a world started after it."""
    with World(1) as first:
        first.run(rank_fns.origin, _MARK)  # the server is running by now
    monkeypatch.setenv(_MARK, "set later")
    with World(2) as world:
        assert [got[1] for got in world.run(rank_fns.origin, _MARK)] == ["set later", "set later"]


def test_ranks_needing_other_start_time_variables_get_a_fork_server_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL ranks come from another server, started so; without it, the first again."""
    with World(1) as first:
        ((plain, _, plain_level),) = first.run(rank_fns.origin, _MARK)
    with monkeypatch.context() as patch:
        patch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        with World(2) as world:
            detail = world.run(rank_fns.origin, _MARK)
    with World(1) as again:
        ((plain_again, _, _),) = again.run(rank_fns.origin, _MARK)
    assert {parent for parent, _, _ in detail} != {plain}
    assert [level for _, _, level in detail] == ["DebugLevel.DETAIL", "DebugLevel.DETAIL"]
    assert all(_parent_of(parent) == os.getpid() for parent, _, _ in detail)
    assert plain_level == "DebugLevel.OFF"
    assert plain_again == plain


def test_a_preloaded_module_is_imported_once_by_the_fork_server_before_its_ranks_fork() -> None:
    """Every rank finds a module of ``preload`` imported by the server, not by itself."""
    with World(2, preload=["tests.testing._preloaded"]) as world:
        got = world.run(rank_fns.preloaded_importer)
    assert len({importer for importer, _, _ in got}) == 1, got
    assert all(importer == parent != rank for importer, rank, parent in got), got


def test_exec_start_method_runs_each_rank_as_a_child_of_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """NEMO_DIST_RANK_START=exec starts each rank as a fresh interpreter, a child of this process."""
    monkeypatch.setenv(RANK_START_ENV, "exec")
    with World(1) as world:
        ((parent, _, _),) = world.run(rank_fns.origin, _MARK)
    assert parent == os.getpid()


def test_an_unknown_start_method_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any other NEMO_DIST_RANK_START value is a ValueError saying what it accepts."""
    monkeypatch.setenv(RANK_START_ENV, "spawn")
    with pytest.raises(ValueError, match=r"NEMO_DIST_RANK_START expects forkserver or exec; got 'spawn'"):
        rank_start_method()
    with pytest.raises(ValueError, match=r"NEMO_DIST_RANK_START expects forkserver or exec"), World(1) as world:
        world.run(rank_fns.origin, _MARK)
