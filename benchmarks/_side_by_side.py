"""What the side-by-side benchmarks share: an earlier commit checked out beside this tree, and both timed in turn.

A ratio measured on one machine, both trees alternately under the same load,
holds across machines where an absolute time does not (machines here differ by
about 1.5 times).
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["ROOT", "alternate", "baseline_tree", "ratio_line"]

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def baseline_tree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary git worktree of this clone, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="nemo_dist_baseline_") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), revision], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def alternate(
    baseline: Path, runs: int, run: Callable[[Path], tuple[float, int, str]]
) -> tuple[dict[str, list[float]], dict[str, str], bool]:
    """``run(tree)`` for the baseline then this tree, ``runs`` times each: the seconds per side, each side's last
    output, and whether every run exited 0. Each run's line is printed as it ends."""
    times: dict[str, list[float]] = {"baseline": [], "this": []}
    outputs: dict[str, str] = {}
    ok = True
    for i in range(runs):
        for name, tree in (("baseline", baseline), ("this", ROOT)):
            seconds, code, outputs[name] = run(tree)
            times[name].append(seconds)
            ok &= code == 0
            print(f"run {i + 1} {name:8}: {seconds:6.1f} s, exit {code}", flush=True)
    return times, outputs, ok


def ratio_line(times: dict[str, list[float]]) -> str:
    """``median baseline B s, this T s, ratio this/baseline R``."""
    base, this = statistics.median(times["baseline"]), statistics.median(times["this"])
    return f"median baseline {base:.1f} s, this {this:.1f} s, ratio this/baseline {this / base:.2f}"
