"""Layer 0 (pytest as a subprocess, no world): ``--require-targets`` turns a missing test target into a failure.

transformers is made unimportable for the child (a package of that name
that raises ImportError, first on its PYTHONPATH). Without the switch the
tests that need it skip, naming the import error; with it (the README's test
command and CI set it) they fail with the same words, so a gate that
installed its targets cannot go green by skipping them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import targets

ROOT = Path(__file__).resolve().parents[1]
#: Tests that need transformers: one at module level, one in a test of the reference's registry.
_NEEDING_TRANSFORMERS = (
    "tests/conformance/test_real_models.py",
    "tests/conformance/test_every_check.py::test_reference_passes_the_registered_check"
    "[ddp.checkpointing_real_models[parallelize_ddp]-w2]",
)
_BLOCKED = "transformers blocked by test_required_targets"


def _pytest_without_transformers(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run pytest on the tests needing transformers, with transformers unimportable; its output."""
    blocker = tmp_path / "blocked" / "transformers"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(f"raise ImportError({_BLOCKED!r})\n")
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", targets.REQUIRE_ENV)}
    child_env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), str(ROOT)])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *_NEEDING_TRANSFORMERS, "-p", "no:cacheprovider", "-q", "-rsf",
         "--dist-world-sizes", "2", "--continue-on-collection-errors", *args],
        cwd=ROOT, env={**child_env, **(env or {})}, capture_output=True, text=True, timeout=240, check=False,
    )
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    ("args", "env"),
    # The variable and the option set one switch (targets.configure); the variable's run is thorough.
    [((targets.OPTION,), {}), pytest.param((), {targets.REQUIRE_ENV: "1"}, marks=pytest.mark.thorough)],
    ids=["option", "environment"],
)
def test_missing_transformers_fails_the_run_naming_the_import_error_under_the_switch(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    """With the switch, each test needing transformers fails, naming the import error and the switch.

    The module-level import fails that module's collection; the test that imports it in its body fails.
    """
    output = _pytest_without_transformers(tmp_path, *args, env=env)
    assert output.startswith("exit 1\n"), output
    failure = f"transformers is not importable (ImportError: {_BLOCKED}); failed, not skipped, under " \
        f"{targets.OPTION} / {targets.REQUIRE_ENV}=1"
    assert output.count(failure) >= 2, output
    assert "1 failed, 1 error" in output, output
    assert "SKIPPED" not in output, output


def test_missing_transformers_is_a_skip_naming_the_import_error_without_the_switch(tmp_path: Path) -> None:
    """Without the switch the same tests skip (exit 0), each naming the import error."""
    output = _pytest_without_transformers(tmp_path)
    assert output.startswith("exit 0\n"), output
    skipped = rf"SKIPPED \[2\] tests/targets\.py:\d+: transformers is not importable \(ImportError: {_BLOCKED}\)"
    assert re.search(skipped, output), output
    assert "2 skipped" in output, output
