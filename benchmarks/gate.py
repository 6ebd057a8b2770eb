"""The gate's pytest time against an earlier commit's, side by side: the gate's budget is a ratio, not seconds.

Run ``python benchmarks/gate.py --baseline REV [--runs N]`` from a clone whose ``.venv`` the README's test command
made. It checks ``REV`` out into a temporary git worktree and runs each tree's gate pytest command (the
``python -m pytest ...`` part of that tree's README test command, with its own package first on the path) from
that tree and from this one alternately, ``--runs`` times each (default 1: a gate run takes minutes), with the
same interpreter and environment, so machine load falls on both alike. It prints each run's wall seconds, exit
status and pytest's closing line, the medians and the ratio this/baseline, then each side's slowest tests
(pytest's ``--durations``) added up by file.

The gate's budget: a new capability keeps it at or under 1.0 of f3a4ed7's pytest time measured this way, the
target being 0.75 (the 300 s figure is what that commit took on the reference machine; machines differ by about
1.5 times).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _side_by_side import alternate, baseline_tree, ratio_line

#: The harness plugin. Trees before it was opt-in (d7a1283) relied on a pytest11 entry point to load it.
PLUGIN = "nemo_dist.testing.plugin"

#: How many of pytest's slowest durations each run reports.
DURATIONS = 60
_DURATION = re.compile(r"^(\d+\.\d+)s (?:call|setup|teardown)\s+(\S+?)::")


def gate_command(tree: Path) -> list[str]:
    """The ``python -m pytest ...`` arguments of ``tree``'s README test command (after ``-m pytest``)."""
    readme = (tree / "README.md").read_text()
    block = readme.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    found = re.search(r"-m pytest([^&]*)", block)
    if found is None:
        raise SystemExit(f"{tree}/README.md: no pytest in the test command")
    return found.group(1).split()


def by_file(output: str) -> list[tuple[str, float]]:
    """pytest's reported slowest durations added up per test file, largest first."""
    sums: dict[str, float] = defaultdict(float)
    for line in output.splitlines():
        found = _DURATION.match(line.strip())
        if found:
            sums[found.group(2)] += float(found.group(1))
    return sorted(sums.items(), key=lambda item: -item[1])


@functools.cache
def plugin_entry_point(tree: Path) -> dict[str, str]:
    """For a tree that relied on the harness plugin's pytest11 entry point, where this environment's install has
    none: a ``PYTHONPATH`` that also holds a distribution declaring it (entry points are read from every path
    entry, so the tree's runs, pytester's in-process ones and its subprocesses alike, find the plugin as that tree's
    own install did); else nothing. Made once per tree and run of this script, and removed at its exit."""
    opts_in = re.search(rf"^addopts = .*{re.escape(PLUGIN)}", (tree / "pyproject.toml").read_text(), re.M)
    if opts_in or any(entry.value == PLUGIN for entry in importlib.metadata.entry_points(group="pytest11")):
        return {}
    where = Path(tempfile.mkdtemp(prefix="nemo-dist-plugin-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    info = where / "nemo_dist_plugin_entry_point-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-dist-plugin-entry-point\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\nnemo_dist = {PLUGIN}\n")
    return {"PYTHONPATH": f"{tree}{os.pathsep}{info.parent}"}


def timed_gate(tree: Path) -> tuple[float, int, str]:
    """Wall seconds, exit status and output of ``tree``'s gate pytest command, its package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree), **plugin_entry_point(tree)}
    command = [sys.executable, "-m", "pytest", *gate_command(tree), "-q", "-p", "no:cacheprovider",
               f"--durations={DURATIONS}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    closing = next((line for line in reversed(lines) if " in " in line and "passed" in line), "")
    print(f"    {closing.strip()}", flush=True)
    for line in lines:
        if line.startswith(("FAILED", "ERROR")):
            print(f"    {line[:200]}", flush=True)
    return seconds, done.returncode, done.stdout


def main(argv: list[str] | None = None) -> int:
    """Time both gates alternately and print the ratio; exit 1 when a run does not exit 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    p.add_argument("--runs", type=int, default=1, help="runs of each tree (default 1)")
    opts = p.parse_args(argv)
    with baseline_tree(opts.baseline) as baseline:
        times, outputs, ok = alternate(baseline, opts.runs, timed_gate)
    print(ratio_line(times))
    for side in ("baseline", "this"):
        print(f"{side}: the slowest {DURATIONS} tests by file")
        for name, seconds in by_file(outputs[side])[:15]:
            print(f"  {seconds:7.1f} s  {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
