"""The harness's own fork server against multiprocessing's forkserver, side by side.

Run ``python benchmarks/forkserver.py [--rounds N]`` from the repository root
(default 15 rounds; 30 to 80 s on a busy 2-core machine). In one run,
alternating the two mechanisms (harness, stdlib, harness, stdlib, ...), it measures

(a) the harness's fork server (``nemo_dist.testing._zygote``, driven by
    ``launcher.spawn_rank``): start a ``World(3, "gloo")`` and run one
    barrier through ``World.run``; then close it;
(b) ``multiprocessing.get_context("forkserver")`` with
    ``set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel"])``:
    start 3 processes that each join a gloo group through ``env://``, run one
    barrier, report and exit. As in the World, this process hosts the
    TCPStore on an OS-assigned free port (``TORCHELASTIC_USE_AGENT_STORE=True``
    makes every env:// rank a client of it), so no rank waits for rank 0 to
    open the store and only the process start differs.

For both: the first world (which starts the server: torch imported once;
this process imports ``torch.distributed`` before, as the harness's parent
needs it for its TCPStore), then the median over ``--rounds`` of the time
to a joined world (every rank past the barrier, as the parent sees it) and
to every rank gone again. Then, once per mechanism:

(c) the exit status the parent observes for a child killed by SIGSEGV, by
    SIGKILL (sent by the parent), ending with ``sys.exit(3)`` and with
    ``os._exit(3)``: the harness's ``ForkedProcess.returncode`` (Popen-style)
    with the World's report, and ``multiprocessing.Process.exitcode``;
(d) cleanup when the parent dies: a parent process starts the server and 2
    children that sleep, is SIGKILLed, and 2 s later ``/proc`` says which of
    the server and the children are still alive (a zombie counts as gone);
    every survivor is then killed and reaped here;
(e) whether a child sees the environment of the moment it was spawned: a
    variable set after the server started, and ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
    (read by torch when it is imported) set after the server started;
(f) whether the preloaded modules can change after the server started.

Every process it starts is stopped before it exits; it prints one table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _forkserver_parts import (
    DEADLINE_S,
    DEBUG_VAR,
    PROBE_VAR,
    STDLIB_PRELOAD,
    announce_and_sleep,
    barrier,
    become_subreaper,
    die_by_signal,
    environment,
    environment_probe,
    exit_via_os,
    exit_via_sys,
    free_port,
    has_module,
    is_alive,
    kill_and_reap,
    parent_pid_of,
    read_line,
    run_stdlib_child,
    stdlib_context,
    stdlib_environment_probe,
    stdlib_rank,
    stop_stdlib_helpers,
    wait_for_messages,
)

SIZE = 3
#: A standard module neither torch nor this script imports: asked for as a preload after the servers started.
LATE_MODULE = "mailbox"
#: How long after the parent's SIGKILL its server and children are looked at.
ORPHAN_GRACE_S = 2.0
#: How long the children of the cleanup test sleep (they are killed long before).
ORPHAN_SLEEP_S = 60.0


# ------------------------------------------------------------------ (a), (b): world start
def harness_world_once() -> tuple[float, float]:
    """Seconds to a joined 3-rank harness World (one barrier run), and to its close."""
    from nemo_dist.testing import World

    start = time.perf_counter()
    world = World(SIZE, "gloo", startup_timeout=DEADLINE_S)
    try:
        world.run(barrier)
        joined = time.perf_counter() - start
    finally:
        world.close()
    return joined, time.perf_counter() - start


def stdlib_world_once(ctx: Any) -> tuple[float, float]:
    """Seconds to a joined 3-rank world of stdlib-forkserver processes (barrier passed), and to all exited."""
    import torch.distributed as dist

    procs, readers = [], []
    start = time.perf_counter()
    deadline = time.monotonic() + DEADLINE_S
    timeout = datetime.timedelta(seconds=DEADLINE_S)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    port = int(store.port)
    try:
        for rank in range(SIZE):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=stdlib_rank, args=(rank, SIZE, port, writer), daemon=True)
            proc.start()
            writer.close()
            procs.append(proc)
            readers.append(reader)
        wait_for_messages(readers, deadline)
        joined = time.perf_counter() - start
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        codes = [proc.exitcode for proc in procs]
        if codes != [0] * SIZE:
            raise RuntimeError(f"stdlib ranks ended with {codes}")
        return joined, time.perf_counter() - start
    finally:
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for reader in readers:
            reader.close()


# ------------------------------------------------------------------ (c): exit codes
#: Label, rank function and its arguments; None: the parent SIGKILLs the idle child.
EXIT_CASES: list[tuple[str, Callable[..., Any] | None, tuple[Any, ...]]] = [
    ("SIGSEGV (child kills itself)", die_by_signal, (signal.SIGSEGV,)),
    ("SIGKILL (sent by the parent)", None, ()),
    ("sys.exit(3)", exit_via_sys, (3,)),
    ("os._exit(3)", exit_via_os, (3,)),
]


def harness_exit_code(fn: Callable[..., Any] | None, args: tuple[Any, ...]) -> str:
    """Run ``fn`` on a 1-rank World: the rank's Popen-style returncode and how the World reports it."""
    from nemo_dist.testing import RankFailure, World

    with World(1, "gloo", startup_timeout=DEADLINE_S) as world:
        world.start()
        handle = world._ranks[0]  # private: the handle whose returncode the World's report is made of
        if fn is None:
            os.kill(handle.proc.pid, signal.SIGKILL)
            fn, args = barrier, ()
        try:
            world.run(fn, *args)
        except RankFailure as exc:
            report = exc.failures[0].splitlines()[0]
        else:
            return "returned normally"
        code = handle.proc.returncode
        return report if code is None else f"{code} ({report})"


def stdlib_exit_code(ctx: Any, fn: Callable[..., Any] | None, args: tuple[Any, ...]) -> str:
    """Run ``fn`` in a stdlib-forkserver process: its ``Process.exitcode``."""
    if fn is None:
        proc = ctx.Process(target=time.sleep, args=(DEADLINE_S,), daemon=True)
        proc.start()
        os.kill(proc.pid, signal.SIGKILL)
    else:
        proc = ctx.Process(target=fn, args=args, daemon=True)
        proc.start()
    proc.join(DEADLINE_S)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        return "did not exit"
    return str(proc.exitcode)


# ------------------------------------------------------------------ (d): cleanup when the parent dies
def orphan_parent(mechanism: str, marker_dir: str) -> int:
    """The parent of the cleanup test: start the server and 2 sleeping children, print the pids, wait to be killed."""
    if mechanism == "harness":
        from nemo_dist.testing import World

        world = World(2, "gloo", timeout=ORPHAN_SLEEP_S * 2, startup_timeout=DEADLINE_S)
        world.start()
        children = world.pids
        report = {"parent": os.getpid(), "server": parent_pid_of(children[0]), "children": children}
        print(json.dumps(report), flush=True)
        world.run(announce_and_sleep, marker_dir, ORPHAN_SLEEP_S)  # SIGKILLed long before it returns
        world.close()
        return 0
    from multiprocessing import resource_tracker

    ctx = stdlib_context()
    procs = [ctx.Process(target=announce_and_sleep, args=(marker_dir, ORPHAN_SLEEP_S)) for _ in range(2)]
    for proc in procs:
        proc.start()
    report = {
        "parent": os.getpid(),
        "server": parent_pid_of(procs[0].pid),
        "children": [proc.pid for proc in procs],
        "tracker": resource_tracker._resource_tracker._pid,  # private: the helper process multiprocessing starts
    }
    print(json.dumps(report), flush=True)
    for proc in procs:
        proc.join()
    return 0


def wait_for_markers(marker_dir: Path, count: int, deadline: float) -> None:
    """Wait until ``count`` children wrote their marker in ``marker_dir`` (bounded by ``deadline``)."""
    while len(list(marker_dir.iterdir())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the children of the cleanup test did not start sleeping")
        time.sleep(0.05)


def cleanup_when_parent_dies(mechanism: str) -> dict[str, str]:
    """SIGKILL a parent that runs a server and 2 sleeping children; which of them live 2 s later."""
    with tempfile.TemporaryDirectory(prefix="forkserver_bench_") as markers, tempfile.TemporaryFile() as log:
        command = [sys.executable, str(Path(__file__).resolve()), "--orphan-parent", mechanism, "--marker-dir", markers]
        parent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        pids: dict[str, Any] = {}
        try:
            deadline = time.monotonic() + DEADLINE_S
            pids = json.loads(read_line(parent.stdout, deadline))
            wait_for_markers(Path(markers), len(pids["children"]), deadline)
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(DEADLINE_S)
            time.sleep(ORPHAN_GRACE_S)
            result = {
                "server": "alive" if is_alive(pids["server"]) else "gone",
                "children": f"{sum(is_alive(pid) for pid in pids['children'])} of {len(pids['children'])} alive",
            }
            if "tracker" in pids:
                result["resource tracker"] = "alive" if is_alive(pids["tracker"]) else "gone"
            return result
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace")
            return {"error": f"{exc}: {tail}"}
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            if parent.stdout is not None:
                parent.stdout.close()
            survivors = [pids.get("server"), pids.get("tracker"), *pids.get("children", [])]
            kill_and_reap([pid for pid in survivors if pid])


# ------------------------------------------------------------------ (e), (f): environment and preload
def harness_environment() -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank views of a plain variable, then of TORCH_DISTRIBUTED_DEBUG=DETAIL, both set after the server started."""
    from nemo_dist.testing import World

    with environment(**{PROBE_VAR: "set after the server started"}):
        with World(1, "gloo", startup_timeout=DEADLINE_S) as world:
            plain = world.run(environment_probe)[0]
        with environment(**{DEBUG_VAR: "DETAIL"}), World(1, "gloo", startup_timeout=DEADLINE_S) as world:
            detail = world.run(environment_probe)[0]
    return plain, detail


def stdlib_environment(ctx: Any) -> dict[str, Any]:
    """A stdlib child's view of both variables set after the server started, and torch's debug level after it
    set them itself (passed as an argument) and joined a 1-rank group."""
    variables = {PROBE_VAR: "set after the server started", DEBUG_VAR: "DETAIL"}
    with environment(**variables):
        env = dict(variables, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
        return dict(run_stdlib_child(ctx, stdlib_environment_probe, env))


def harness_preload() -> tuple[bool, bool]:
    """Whether a rank has LATE_MODULE without, then with, ``World(preload=...)`` after the server started."""
    from nemo_dist.testing import World

    with World(1, "gloo", startup_timeout=DEADLINE_S) as world:
        before = world.run(has_module, LATE_MODULE)[0]
    try:
        late = World(1, "gloo", startup_timeout=DEADLINE_S, preload=(LATE_MODULE,))
    except TypeError:  # a World without preload
        return before, False
    with late as world:
        after = world.run(has_module, LATE_MODULE)[0]
    return before, after


def stdlib_preload(ctx: Any) -> tuple[bool, bool]:
    """Whether a child has LATE_MODULE without, then with, ``set_forkserver_preload`` after the server started."""
    before = run_stdlib_child(ctx, has_module, LATE_MODULE)
    ctx.set_forkserver_preload([*STDLIB_PRELOAD, LATE_MODULE])
    try:
        after = run_stdlib_child(ctx, has_module, LATE_MODULE)
    finally:
        ctx.set_forkserver_preload(STDLIB_PRELOAD)
    return bool(before), bool(after)


# ------------------------------------------------------------------ report
def yes_no(flag: bool) -> str:
    """The word for ``flag``: yes or no."""
    return "yes" if flag else "no"


def print_table(rows: list[tuple[str, str, str]]) -> None:
    """Print ``(what, harness, stdlib)`` rows as three aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for what, harness, stdlib in rows:
        print(f"{what:<{widths[0]}}  {harness:<{widths[1]}}  {stdlib}")


def compare(rounds: int) -> None:
    """Measure both fork servers side by side, ``rounds`` timed world starts each, and print the table."""
    from nemo_dist.testing.launcher import RANK_START_ENV

    os.environ[RANK_START_ENV] = "forkserver"  # the harness's default; an inherited "exec" would measure nothing
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))  # the SIGSEGV cases leave no core file
    become_subreaper()
    import torch.distributed  # noqa: F401 - the harness's parent needs it (TCPStore): not a server's cost

    began = time.monotonic()
    ctx = stdlib_context()

    # (a), (b): the first round starts each server; then alternate, harness first.
    first_harness = harness_world_once()
    # The stdlib server starts on the first Process.start(); give it OPENBLAS_NUM_THREADS=1 as the harness's gets.
    with environment(OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1")):
        first_stdlib = stdlib_world_once(ctx)
    harness_times, stdlib_times = [], []
    for _ in range(rounds):
        harness_times.append(harness_world_once())
        stdlib_times.append(stdlib_world_once(ctx))

    # (c) to (f)
    exit_rows = [
        (f"exit status: {label}", harness_exit_code(fn, fn_args), stdlib_exit_code(ctx, fn, fn_args))
        for label, fn, fn_args in EXIT_CASES
    ]
    plain, detail = harness_environment()
    stdlib_env = stdlib_environment(ctx)
    harness_before, harness_after = harness_preload()
    stdlib_before, stdlib_after = stdlib_preload(ctx)
    harness_orphans = cleanup_when_parent_dies("harness")
    stdlib_orphans = cleanup_when_parent_dies("stdlib")

    def median_s(times: list[tuple[float, float]], which: int) -> str:
        """The median of column ``which`` of ``times``, as text."""
        return f"{statistics.median(t[which] for t in times):.2f} s"

    def each_s(times: list[tuple[float, float]], which: int) -> str:
        """Column ``which`` of ``times``, every round, as text."""
        return " ".join(f"{t[which]:.2f}" for t in times)

    print(f"fork servers side by side: {SIZE}-rank gloo world, {os.cpu_count()} CPUs, {rounds} rounds")
    rows = [
        ("", "harness (_zygote)", "stdlib forkserver"),
        ("first world, server start included: joined", f"{first_harness[0]:.2f} s", f"{first_stdlib[0]:.2f} s"),
        ("world joined (median)", median_s(harness_times, 0), median_s(stdlib_times, 0)),
        ("world joined and gone (median)", median_s(harness_times, 1), median_s(stdlib_times, 1)),
        *exit_rows,
    ]
    for key in ("server", "children", "resource tracker"):
        rows.append(
            (f"parent SIGKILLed, 2 s later: {key}", harness_orphans.get(key, "-"), stdlib_orphans.get(key, "-"))
        )
    for name, orphans in (("harness", harness_orphans), ("stdlib", stdlib_orphans)):
        if "error" in orphans:
            print(f"cleanup test ({name}) failed: {orphans['error']}", file=sys.stderr)
    harness_servers = "own server" if detail["server"] != plain["server"] else "same server"
    rows += [
        (
            f"{PROBE_VAR} set after server start: child sees it",
            yes_no(plain["probe"] is not None),
            yes_no(stdlib_env["probe"] is not None),
        ),
        (
            f"{DEBUG_VAR}=DETAIL set after server start: child sees it",
            yes_no(detail["debug_env"] == "DETAIL"),
            yes_no(stdlib_env["debug_env"] == "DETAIL"),
        ),
        (
            "  ... torch's debug level in the child",
            f"{detail['debug_level']} ({harness_servers})",
            f"{stdlib_env['debug_level']} (after the child set the variable itself)",
        ),
        (
            f"preload {LATE_MODULE} asked after server start: child has it",
            f"{yes_no(harness_after)} (before asking: {yes_no(harness_before)})",
            f"{yes_no(stdlib_after)} (before asking: {yes_no(stdlib_before)})",
        ),
    ]
    print_table(rows)
    print(f"world joined, each round (s): harness {each_s(harness_times, 0)}")
    print(f"                              stdlib  {each_s(stdlib_times, 0)}")
    print(f"total {time.monotonic() - began:.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Measure both fork servers side by side and print the table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed world starts per mechanism (after a warm one)")
    parser.add_argument("--orphan-parent", choices=("harness", "stdlib"), help=argparse.SUPPRESS)
    parser.add_argument("--marker-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.orphan_parent:
        return orphan_parent(args.orphan_parent, args.marker_dir)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    try:
        compare(args.rounds)
    finally:
        stop_stdlib_helpers()
    return 0


if __name__ == "__main__":
    # Rank functions are pickled by reference, and __main__ is not importable in a
    # harness rank: run main from this file imported under its module name.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import forkserver

    sys.exit(forkserver.main())
