"""Cost of the README's main job (the bundled conformance run) against an earlier commit, side by side.

Run ``python benchmarks/bundled_run.py --baseline REV [--runs N] [-- ARGS...]`` from a
clone. It checks ``REV`` out into a temporary git worktree and runs each
tree's ``nemo-dist-conformance`` console script (the function its
``pyproject.toml`` names, as the README's main command runs it) with
``-q ARGS`` from that tree and from this one
alternately, ``--runs`` times each (default 3), with the same interpreter and
environment, so machine load falls on both alike. It prints each run's wall
seconds and exit status, the medians and the ratio this/baseline. A change
may make the bundled run at most 15% slower (ratio 1.15).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def console_script(tree: Path) -> tuple[str, str]:
    """(module, function) of ``tree``'s ``nemo-dist-conformance`` console script, as its pyproject.toml names it."""
    found = re.search(r'^nemo-dist-conformance = "([\w.]+):(\w+)"', (tree / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise SystemExit(f"{tree}/pyproject.toml names no nemo-dist-conformance script")
    return found.group(1), found.group(2)


def timed_run(tree: Path, args: list[str]) -> tuple[float, int]:
    """Wall seconds and exit status of ``tree``'s console script (its package first on the path), as installed."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    module, function = console_script(tree)
    script = f"import sys; from {module} import {function}; sys.exit({function}())"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, "-q", *args],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )
    return time.perf_counter() - start, done.returncode


def main(argv: list[str] | None = None) -> int:
    """Time both trees alternately and print the ratio; exit 1 when a run does not exit 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    p.add_argument("--runs", type=int, default=3, help="runs of each tree (default 3)")
    p.add_argument("args", nargs="*", help="arguments of the conformance command (after --)")
    opts = p.parse_args(argv)
    times: dict[str, list[float]] = {"baseline": [], "this": []}
    ok = True
    with tempfile.TemporaryDirectory(prefix="nemo_dist_baseline_") as tmp:
        baseline = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(baseline), opts.baseline], cwd=ROOT, check=True)
        try:
            for i in range(opts.runs):
                for name, tree in (("baseline", baseline), ("this", ROOT)):
                    seconds, code = timed_run(tree, opts.args)
                    times[name].append(seconds)
                    ok &= code == 0
                    print(f"run {i + 1} {name:8}: {seconds:6.1f} s, exit {code}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    base, this = statistics.median(times["baseline"]), statistics.median(times["this"])
    print(f"median baseline {base:.1f} s, this {this:.1f} s, ratio this/baseline {this / base:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
