"""Harness: every gloo group of a rank shares one transport device (one I/O thread, batch-scheduled), and keeps
its semantics."""

from __future__ import annotations

import datetime
import os
import threading

import pytest
import torch
import torch.distributed as dist

from nemo_dist.testing import World
from nemo_dist.testing._gloo_device import batch_scheduled, one_device_backend

_LOOP_THREAD = "gloo_tcp_loop"
_LINUX_POLICIES = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux's")


def _loop_thread_policies() -> list[int]:
    """The scheduling policy of each thread of this process named as gloo's TCP I/O thread names itself."""
    policies = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().strip() == _LOOP_THREAD:
                    policies.append(os.sched_getscheduler(int(task)))
        except OSError:  # the thread ended while listed
            continue
    return policies


def _groups_reduce_and_count_threads(timeout_s: float) -> tuple[list[float], float, list[int], int]:
    """On every rank: four new groups (the world, pairs, this rank alone) each all-reduce their ranks plus one;
    the sums, the timeout a group given ``timeout_s`` holds, the policy of each gloo I/O thread in this rank, and
    the main thread's policy."""
    size, rank = dist.get_world_size(), dist.get_rank()
    everyone = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=timeout_s))
    pairs = [dist.new_group([r, (r + 1) % size]) for r in range(0, size - 1, 2)]
    alone = [dist.new_group([r]) for r in range(size)]
    sums = []
    for group in (everyone, *pairs, alone[rank]):
        if group == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        value = torch.tensor([rank + 1.0], dtype=torch.float64)
        dist.all_reduce(value, group=group)
        sums.append(value.item())
    held = everyone._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    return sums, held, _loop_thread_policies(), os.sched_getscheduler(0)


@_LINUX_POLICIES
def test_every_gloo_group_of_a_rank_shares_one_batch_scheduled_io_thread_and_reduces_exactly() -> None:
    """Groups over all ranks, over pairs and over one rank reduce exactly, each keeps its own timeout, and every
    rank runs one gloo I/O thread however many groups it made (torch alone makes one a group), under SCHED_BATCH
    while the rank's own thread keeps the normal policy."""
    with World(3, timeout=60.0) as world:
        results = world.run(_groups_reduce_and_count_threads, 17.0)
    for rank, (sums, held, policies, main_policy) in enumerate(results):
        pair = [s for s in (1.0 + 2.0,) if rank in (0, 1)]
        assert sums == [6.0, *pair, rank + 1.0], (rank, sums)
        assert held == 17.0
        assert policies == [os.SCHED_BATCH], f"rank {rank}: gloo I/O threads with policies {policies}"
        assert main_policy == os.SCHED_OTHER


@_LINUX_POLICIES
def test_batch_scheduled_switches_the_threads_started_inside_it_and_no_other() -> None:
    """A thread started inside ``make`` runs under SCHED_BATCH once it returns; one started before keeps its
    policy, and so does the calling thread; ``make``'s result is returned."""
    release = threading.Event()
    before = threading.Thread(target=release.wait)
    before.start()
    started: list[threading.Thread] = []

    def make() -> str:
        thread = threading.Thread(target=release.wait)
        thread.start()
        started.append(thread)
        return "made"

    try:
        assert batch_scheduled(make) == "made"
        assert os.sched_getscheduler(started[0].native_id) == os.SCHED_BATCH
        assert os.sched_getscheduler(before.native_id) == os.SCHED_OTHER
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        release.set()
        for thread in (before, *started):
            thread.join()


def test_groups_built_by_the_class_share_its_device_and_hold_their_options() -> None:
    """In one process: groups built from a timeout share the one device, with two worker threads each, and
    reduce; a group given options that name a device of their own keeps it."""
    base = dist.ProcessGroupGloo
    backend = one_device_backend(base)
    first = backend(dist.HashStore(), 0, 1, timeout=datetime.timedelta(seconds=5))
    second = backend(dist.HashStore(), 0, 1, datetime.timedelta(seconds=9))
    assert isinstance(first, base)
    assert type(first).__name__ == "ProcessGroupGloo"
    assert first.options._devices[0] is second.options._devices[0]
    assert (first.options._threads, second.options._timeout) == (2, datetime.timedelta(seconds=9))
    value = torch.ones(3)
    first.allreduce([value]).wait()
    assert torch.equal(value, torch.ones(3))

    own = base.create_default_device()
    options = base._Options()
    options._devices = [own]
    third = backend(dist.HashStore(), 0, 1, options)
    assert third.options._devices[0] is own
    assert own is not first.options._devices[0]


def test_groups_get_a_device_per_interface_gloo_socket_ifname_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GLOO_SOCKET_IFNAME=lo,lo``: every group shares the two devices made for it, with two worker threads each,
    as torch gives a group of two devices."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,lo")
    backend = one_device_backend(dist.ProcessGroupGloo)
    first = backend(dist.HashStore(), 0, 1, timeout=datetime.timedelta(seconds=5))
    second = backend(dist.HashStore(), 0, 1, timeout=datetime.timedelta(seconds=5))
    assert len(first.options._devices) == 2
    assert first.options._threads == 4
    assert all(a is b for a, b in zip(first.options._devices, second.options._devices, strict=True))
