"""One gloo transport device for every gloo process group of a rank.

torch gives each gloo process group a device of its own, and gloo's TCP
device runs an I/O thread that wakes every 10 ms even while the group is
idle. A rank of the harness lives for a whole session and keeps every group
its checks made (meshes, subgroups, the debug wrapper's helper groups):
hundreds of such threads across the worlds of a test run, tens of thousands
of wakeups a second on a small machine, all of them stolen from the ranks
doing work. Sharing one device changes no collective's semantics: each group
keeps its own context, pairs and worker threads, and the one I/O thread
serves every pair as each group's own thread did.

The devices are the ones torch would make for a group: one per interface
``GLOO_SOCKET_IFNAME`` lists (the harness names ``lo``), else the default
device, on the transport ``GLOO_DEVICE_TRANSPORT`` names, but made once per
process. :func:`share_one_device` installs it in a rank before it joins. Where
torch builds a group in a way this module does not know, torch's own
construction stands.

The shared devices' I/O threads run under Linux's ``SCHED_BATCH`` policy:
the same share of the CPU as any thread, but a wakeup does not preempt the
thread that is running. Woken by a message, gloo's I/O thread tries the
lock of the message's pair; where one of the rank's worker threads holds it
(posting a send or a receive), it returns to ``epoll_wait``, which reports
the same message at once, and spins so until the holder runs again (gloo's
``Pair::handleEvents``; pytorch/gloo issue 246). With more busy threads
than cores, the wakeup can preempt the holder on its own core, and the I/O
thread spins through its whole time slice. Under ``SCHED_BATCH`` the holder
finishes first. Where the policy is unknown or refused the threads keep
theirs. ``benchmarks/gloo_io_thread.py`` measures both policies side by side.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["batch_scheduled", "one_device_backend", "share_one_device"]

#: Worker threads per group and device, as torch gives them.
_THREADS_PER_DEVICE = 2

_T = TypeVar("_T")


def _devices(base: Any) -> list[Any]:
    """The devices torch would make for one group: one per interface ``GLOO_SOCKET_IFNAME`` lists, else the
    default device (as torch reads the variable: a value of one character names none)."""
    names = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(names) > 1:
        return [base.create_device(interface=name) for name in names.split(",")]
    return [base.create_default_device()]


def _threads() -> set[int]:
    """This process's thread ids (none where ``/proc`` does not list them)."""
    try:
        return {int(task) for task in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def batch_scheduled(make: Callable[[], _T]) -> _T:
    """``make()``, each thread it started in this process switched to ``SCHED_BATCH`` (Linux) as it returns.

    A thread that ended, or a system that has no such policy or refuses it,
    is left as it is. Threads other code starts meanwhile are switched too.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return make()
    before = _threads()
    made = make()
    for thread in _threads() - before:
        try:
            os.sched_setscheduler(thread, policy, os.sched_param(0))
        except OSError:  # ended since it was listed, or the policy is refused here
            continue
    return made


def one_device_backend(base: Any) -> type:
    """A subclass of ``base`` (torch's ``ProcessGroupGloo``) whose instances share the devices made when it is.

    It accepts what ``base`` accepts. Built from a timeout (and any
    ``enable_reconfigure``), a group gets the shared devices and two worker
    threads a device, as torch would give it devices of its own; built from
    options that name no device, the shared ones; anything else is passed to
    ``base`` as it is. The devices' I/O threads run under ``SCHED_BATCH``
    (:func:`batch_scheduled`).
    """
    devices = batch_scheduled(lambda: _devices(base))

    class OneDeviceGloo(base):
        __doc__ = base.__doc__

        def __init__(self, store: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> None:
            options = _options(base, devices, args, kwargs)
            if options is None:
                super().__init__(store, rank, size, *args, **kwargs)
            else:
                super().__init__(store, rank, size, options)

    # Its name stays torch's (code may read a group's type by name); its module says whose it is.
    OneDeviceGloo.__name__ = OneDeviceGloo.__qualname__ = base.__name__
    return OneDeviceGloo


def _options(base: Any, devices: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The options to build a group with on the shared device, or None to leave the call to torch."""
    known = {"timeout", "enable_reconfigure", "options"}
    if len(args) > 1 or set(kwargs) - known:
        return None
    given = args[0] if args else kwargs.get("options", kwargs.get("timeout"))
    if isinstance(given, base._Options):
        if given._devices or set(kwargs) - {"options"}:
            return None
        given._devices = devices
        return given
    if given is not None and not isinstance(given, datetime.timedelta):
        return None
    options = base._Options()
    options._devices = devices
    options._threads = _THREADS_PER_DEVICE * len(devices)
    if given is not None:
        options._timeout = given
    if "enable_reconfigure" in kwargs:
        if not hasattr(options, "enable_reconfigure"):
            return None
        options.enable_reconfigure = kwargs["enable_reconfigure"]
    return options


def share_one_device() -> bool:
    """Make every gloo group this process creates from now on share one device; whether it was installed.

    Call it before ``init_process_group`` in a process of its own (a rank):
    it replaces the class ``torch.distributed.distributed_c10d`` builds gloo
    groups with by :func:`one_device_backend` of it. Not installed (False)
    where torch has no gloo.
    """
    from torch.distributed import distributed_c10d

    if not distributed_c10d.is_gloo_available():
        return False
    base = distributed_c10d.ProcessGroupGloo
    if getattr(base, "_nemo_dist_one_device", False):
        return True
    backend = one_device_backend(base)
    backend._nemo_dist_one_device = True  # type: ignore[attr-defined]
    distributed_c10d.ProcessGroupGloo = backend  # type: ignore[misc, assignment]
    return True
