"""No false HANG on a busy machine: the conformance command under CPU oversubscription and a cold bytecode cache.

Run ``python benchmarks/busy_machine.py [--runs N] [--busy-per-core K] [--world-sizes SIZES] [--only NAMES]``
from the repository root. It starts K busy-loop processes per core (default
3) and keeps them spinning while it runs, each ``--runs`` times (default 5)
and each time with ``PYTHONPYCACHEPREFIX`` set to a fresh empty directory (so
every rank compiles torch's bytecode afresh):

- ``bundled``: the bundled reference, the README's main command;
- ``upstream_faithful``: the upstream-faithful fork (``tests/forks/upstream_faithful_*``);
- ``gallery_*``: every gallery gather that conforms (``--gather-fn``);
- ``guard_hangs``: the gallery's subgroup-guard fork on the one check it
  hangs (world size 3, extended tier: exit 0), which must still be HANG, its
  verdict in under 60 s.

It runs in rounds, every target once per round, and prints each run as it
ends (exit status, HANG verdicts with their seconds, wall time, ok or not);
at the end, per target, PASS or FAIL against those expectations (exit status
1 on any FAIL, or on a target with fewer runs than asked). The figures in
the README come from this script.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BUSY_LOOP = "while True:\n    pass\n"
#: The guard fork must be reported HANG within this many seconds (issue 12's bound).
GUARD_HANG_LIMIT_S = 60.0


@dataclass(frozen=True)
class Target:
    """One command line to run under load, and what a correct verdict looks like."""

    name: str
    args: tuple[str, ...]
    expect_hang: bool = False  # True: exit 0 on core with exactly the planted HANG; else exit 0, no HANG


def targets(world_sizes: str) -> list[Target]:
    """The bundled run, the upstream-faithful fork, each conforming gallery gather and the guard fork."""
    sizes = ("--world-sizes", world_sizes)
    gallery: list[tuple[str, tuple[str, ...]]] = [
        ("gallery_gather_layer_summed", ("tests.forks.gallery_gather_layer_summed:GatherLayer",)),
        ("gallery_stacked_global_rank", ("tests.forks.gallery_stacked_global_rank:AllGather",)),
        ("gallery_list_own_slot_is_input", ("tests.forks.gallery_list_own_slot_is_input:gather_list",)),
        (
            "gallery_gather_with_sizes",
            (
                "tests.forks.gallery_gather_with_sizes:gather_with_sizes",
                "--gather-kwarg", "dim=0", "--gather-output", "0",
            ),
        ),
    ]
    return [
        Target("bundled", sizes),
        Target(
            "upstream_faithful",
            (
                "--gather", "tests.forks.upstream_faithful_dist_utils",
                "--ddp", "tests.forks.upstream_faithful_ddp",
                "--config", "tests.forks.upstream_faithful_config",
                *sizes,
            ),
        ),
        *(Target(name, ("--gather-fn", *call, *sizes)) for name, call in gallery),
        Target(
            "guard_hangs",
            (
                "--gather-fn", "tests.forks.gallery_subgroup_guard_hangs:GroupGather",
                "--world-sizes", "3", "-k", "group_uses_group_ranks",
            ),
            expect_hang=True,
        ),
    ]


@dataclass(frozen=True)
class Run:
    """One run of a target: its exit status, its HANG verdicts' seconds and its wall seconds."""

    code: int
    hang_seconds: tuple[float, ...]  # each HANG verdict's time (its check, world start included)
    seconds: float
    waited: tuple[float, ...] = ()  # how long each hung step was waited for before it was judged

    def ok(self, target: Target) -> bool:
        """Whether this run is what a correct tool gives for ``target``."""
        if target.expect_hang:
            return self.code == 0 and len(self.hang_seconds) == 1 and self.hang_seconds[0] < GUARD_HANG_LIMIT_S
        return self.code == 0 and not self.hang_seconds


def _hangs(junit: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each HANG verdict's seconds and its hung step's wait, from the command's JUnit XML."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return (), ()
    seconds: list[float] = []
    waited: list[float] = []
    for case in root.iter("testcase"):
        outcomes = [p.get("value") for p in case.iter("property") if p.get("name") == "outcome"]
        if outcomes != ["hang"]:
            continue
        # a blocking HANG's text is an <error>, one that does not block (extended tier) is the <system-out>
        text = "".join(e.text or "" for e in case if e.tag in ("error", "failure", "system-out"))
        seconds.append(float(case.get("time", "0")))
        found = re.search(r"waited ([0-9.]+) s in all", text)
        waited.append(float(found.group(1)) if found else float("nan"))
    return tuple(seconds), tuple(waited)


def run_once(target: Target, timeout_s: float) -> tuple[Run, str]:
    """Run ``target`` once with a fresh bytecode cache; the run and the command's output."""
    with tempfile.TemporaryDirectory(prefix="nemo_dist_pycache_") as cache:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": cache}
        junit = Path(cache) / "verdicts.xml"
        start = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "nemo_dist.conformance", "-q", "--junit-xml", str(junit), *target.args],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
            )
            code, out = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code, out = -1, f"did not exit within {timeout_s:g} s\n{exc.stdout or ''}"
        hang_seconds, waited = _hangs(junit)
        return Run(code, hang_seconds, time.monotonic() - start, waited), out


def _busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP]) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    """Run every target under load and print the results; exit 1 if any run is not what a correct tool gives."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per target (default 5)")
    p.add_argument("--busy-per-core", type=int, default=3, help="busy-loop processes per core (default 3)")
    p.add_argument("--world-sizes", default="1,2,3,4", help="world sizes of the non-guard runs (default 1,2,3,4)")
    p.add_argument("--only", default="", help="targets to run, in this order each round (default all)")
    p.add_argument("--run-timeout", type=float, default=3600.0, help="seconds one run may take (default 3600)")
    p.add_argument("--log-dir", default="", help="write each run's output there")
    args = p.parse_args(argv)
    every = {t.name: t for t in targets(args.world_sizes)}
    names = [n for n in args.only.split(",") if n] or list(every)
    if unknown := [n for n in names if n not in every]:
        p.error(f"--only: no target {', '.join(unknown)}; the targets are {', '.join(every)}")
    chosen = [every[n] for n in names]
    cores = os.cpu_count() or 1
    print(f"{cores} cores, {args.busy_per_core * cores} busy-loop processes, {args.runs} runs per target, "
          f"world sizes {args.world_sizes}, cold bytecode cache each run", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the busy loops too
    busy = _busy_loops(args.busy_per_core * cores)
    runs: dict[str, list[Run]] = {t.name: [] for t in chosen}
    try:
        # Round by round, every target once per round: a run cut short still has each target's runs so far.
        for i in range(args.runs):
            for target in chosen:
                run, out = run_once(target, args.run_timeout)
                runs[target.name].append(run)
                if args.log_dir:
                    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
                    (Path(args.log_dir) / f"{target.name}-{i}.log").write_text(out)
                hung = "".join(
                    f" (verdict {s:.0f} s, step judged after {w:.0f} s)"
                    for s, w in zip(run.hang_seconds, run.waited, strict=True)
                )
                print(f"  round {i + 1}: {target.name}: exit {run.code}, {len(run.hang_seconds)} HANG{hung}, "
                      f"{run.seconds:.0f} s, {'ok' if run.ok(target) else 'NOT OK'}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    failed = False
    for target in chosen:
        done = runs[target.name]
        good = len(done) == args.runs and all(r.ok(target) for r in done)
        failed |= not good
        codes = ",".join(str(r.code) for r in done)
        hangs = sum(len(r.hang_seconds) for r in done)
        slowest = max((r.seconds for r in done), default=0.0)
        print(f"{'PASS' if good else 'FAIL'} {target.name}: {len(done)} runs, exit {codes}; {hangs} HANG in all; "
              f"slowest run {slowest:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
