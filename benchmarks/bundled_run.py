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

It then compares the verdict tables of both trees' last runs, row by row
(check, world, tier, verdict; timings aside): rows of checks the baseline
does not have are counted as new, and every other row that differs is
printed, so "the same rows apart from timings" is read off its output.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _side_by_side import alternate, baseline_tree, ratio_line


def console_script(tree: Path) -> tuple[str, str]:
    """(module, function) of ``tree``'s ``nemo-dist-conformance`` console script, as its pyproject.toml names it."""
    found = re.search(r'^nemo-dist-conformance = "([\w.]+):(\w+)"', (tree / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise SystemExit(f"{tree}/pyproject.toml names no nemo-dist-conformance script")
    return found.group(1), found.group(2)


#: A row of the verdict table: check, world, tier, verdict, then its time (left out).
_ROW = re.compile(r"^(\S+)\s+(-|\d+)\s+(core|extended)\s+(.+?)\s+\d+\.\d+s$")


def table_rows(output: str) -> set[tuple[str, str, str, str]]:
    """The (check, world, tier, verdict) rows of a run's verdict table, timings left out."""
    return {found.groups() for line in output.splitlines() if (found := _ROW.match(line))}  # type: ignore[misc]


def compare_rows(baseline: set[tuple[str, str, str, str]], this: set[tuple[str, str, str, str]]) -> list[str]:
    """Lines saying how ``this`` table differs from ``baseline``'s: new checks counted, other changes listed."""
    known = {row[0] for row in baseline}
    new = {row for row in this if row[0] not in known}
    lines = [f"rows of checks the baseline does not have: {len(new)} ({len({row[0] for row in new})} checks)"]
    changed = sorted((baseline - this) | ((this - baseline) - new))
    for row in changed:
        side = "baseline only" if row in baseline else "this only"
        lines.append(f"  {side:13}  {'  '.join(row)}")
    lines.append(
        f"rows of the baseline's checks: {'identical apart from timings' if not changed else f'{len(changed)} differ'}"
    )
    return lines


def timed_run(tree: Path, args: list[str]) -> tuple[float, int, str]:
    """Wall seconds, exit status and stdout of ``tree``'s console script (its package first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    module, function = console_script(tree)
    script = f"import sys; from {module} import {function}; sys.exit({function}())"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, "-q", *args],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )
    return time.perf_counter() - start, done.returncode, done.stdout


def main(argv: list[str] | None = None) -> int:
    """Time both trees alternately and print the ratio; exit 1 when a run does not exit 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    p.add_argument("--runs", type=int, default=3, help="runs of each tree (default 3)")
    p.add_argument("args", nargs="*", help="arguments of the conformance command (after --)")
    opts = p.parse_args(argv)
    with baseline_tree(opts.baseline) as baseline:
        times, outputs, ok = alternate(baseline, opts.runs, lambda tree: timed_run(tree, opts.args))
    print(ratio_line(times))
    print("\n".join(compare_rows(table_rows(outputs["baseline"]), table_rows(outputs["this"]))))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
