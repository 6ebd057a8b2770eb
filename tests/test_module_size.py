"""Layer 0: no module of the project is over 450 lines (issue 27), so one job per module stays readable."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where the project's own Python lives (a virtual environment or a build folder is not the project's).
TREES = ("nemo_dist", "tests", "benchmarks", "scripts", "conformance")
#: The most lines a module may have.
MAX_LINES = 450


def test_no_module_is_over_450_lines() -> None:
    """Every ``.py`` file of the project's trees has at most ``MAX_LINES`` lines; the test names each one over."""
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
    }
    assert len(sizes) > 100, f"found only {len(sizes)} modules under {TREES}: is ROOT {ROOT} the project?"
    over = {name: lines for name, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each by what its parts do): {over}"
