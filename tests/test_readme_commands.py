"""Layer 0 (no process): the README's two commands exist and CI runs the test one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\n```\n(.+?)\n```\n<!-- /{marker} -->", text, re.S)
    assert match, f"README.md has no {marker} block"
    return match.group(1)


def test_readme_main_command_runs_the_conformance_suite() -> None:
    """The main job installs the project and runs nemo-dist-conformance."""
    command = _block("main-command")
    assert "torch==2.13.0" in command
    assert "models]" in command  # transformers: the real-model checks of the core tier run, none skipped
    assert command.endswith("nemo-dist-conformance")


def test_readme_test_command_runs_pytest_and_ci_reads_it() -> None:
    """The test command runs pytest with the upstream targets installed, and .ci/run executes exactly that block."""
    command = _block("test-command")
    assert "torch==2.13.0" in command
    assert "models]" in command  # transformers, for the real-architecture tests
    assert "--no-deps nemo-automodel==0.7.0" in command  # upstream itself, for the upstream-marked test
    assert "-m pytest" in command
    assert "--require-targets" in command.split("-m pytest", 1)[1]  # transformers and upstream fail, never skip
    assert "upstream" not in command.split("-m pytest", 1)[1]  # no marker filter: CI runs the upstream test too
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci
    assert "README.md" in ci
