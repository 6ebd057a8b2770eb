"""Harness layer 0 (no process group, fakes only): what the harness passes on.

The NCCL device id a rank hands ``init_process_group``, and the time limit of
every wait for a killed rank (a process stuck in the kernel outlives SIGKILL;
no real one can be made to, so a fake stands in). These are argument
plumbing checks with fake callables and processes; the distributed behaviour
itself is tested in real worlds (test_world.py) and on GPU hosts.
"""

from __future__ import annotations

import socket
import subprocess
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dist.testing import World, _rank, processes


def _new_init(backend: str, *, rank: int = 0, device_id: Any = None) -> None:
    """Stands in for torch >= 2.3's init_process_group."""


def _old_init(backend: str, *, rank: int = 0) -> None:
    """Stands in for an init_process_group without device_id."""


@pytest.mark.parametrize(
    ("init", "device", "expected"),
    [
        (_new_init, torch.device("cuda", 1), {"device_id": torch.device("cuda", 1)}),
        (_old_init, torch.device("cuda", 1), {}),
        (_new_init, None, {}),
    ],
    ids=["torch-with-device-id", "older-torch", "no-device-gloo"],
)
def test_nccl_join_passes_the_device_id_where_torch_accepts_it(init: Any, device: Any, expected: dict) -> None:
    """A rank's device reaches init_process_group as device_id only where that parameter exists."""
    assert _rank._device_id_kwargs(init, device) == expected


def test_the_installed_torch_takes_a_device_id() -> None:
    """torch >= 2.4 (the floor in pyproject.toml) accepts device_id: NCCL worlds create communicators at start."""
    import torch.distributed as dist

    assert _rank._device_id_kwargs(dist.init_process_group, torch.device("cuda", 0)) == {
        "device_id": torch.device("cuda", 0)
    }


class _StuckProcess:
    """A process that never exits, even after SIGKILL: every wait times out."""

    pid = 424242

    def __init__(self) -> None:
        self.kills = 0
        self.waits: list[float | None] = []

    def poll(self) -> int | None:
        return None

    def kill(self) -> None:
        self.kills += 1

    def send_signal(self, signum: int) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded wait for a killed process")
        raise subprocess.TimeoutExpired("rank", timeout)


def _stuck_rank(rank: int, tmp_path: Path) -> tuple[processes.RankProcess, _StuckProcess]:
    ours, theirs = socket.socketpair()
    theirs.close()
    proc = _StuckProcess()
    stack = tmp_path / f"rank{rank}.stack"
    stack.write_text("")
    handle = processes.RankProcess(rank, proc, Connection(ours.detach()), None, tmp_path / "none", stack)  # type: ignore[arg-type]
    return handle, proc


def test_kill_and_wait_gives_up_after_its_time_limit() -> None:
    """A process that outlives SIGKILL is killed once, waited for with a limit, and reported as None."""
    proc = _StuckProcess()
    assert processes.kill_and_wait(proc, 0.25) is None
    assert (proc.kills, proc.waits) == (1, [0.25])


def test_teardown_of_a_stuck_rank_is_bounded_and_says_so(tmp_path: Path) -> None:
    """Reaping, death reports and stack dumps of a stuck rank each wait with a limit, once, and name it."""
    handle, proc = _stuck_rank(1, tmp_path)
    assert processes.death_text(handle) == (
        f"rank 1 died: closed its pipe; rank 1 (pid {proc.pid}) did not exit within "
        f"{processes.REAP_AFTER_KILL_S:g} s of SIGKILL and was left running"
    )
    assert "was left running" in processes.dump_stacks([handle])[1]
    assert processes.reap(handle) is False
    assert None not in proc.waits
    assert proc.waits.count(processes.REAP_AFTER_KILL_S) == 1  # left running: never waited for again


def test_close_of_a_world_with_stuck_ranks_warns_and_returns(tmp_path: Path) -> None:
    """World.close frees everything it can, then names the ranks it had to leave in a RuntimeWarning."""
    world = World(2)
    stuck = [_stuck_rank(rank, tmp_path) for rank in range(2)]
    world._ranks = [handle for handle, _ in stuck]
    with pytest.warns(RuntimeWarning, match=r"rank 0 \(pid \d+\), rank 1 \(pid \d+\) did not exit .* were left"):
        world.close()
    assert world.pids == []
    for _, proc in stuck:
        assert None not in proc.waits
