"""Run the conformance command as a subprocess from the checkout root, or in this process (helper of the CLI tests)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from nemo_dist.conformance.frontends.cli import main

__all__ = [
    "CONFORMANCE_OPTIONS",
    "PYTEST_FAILING_ARGS",
    "PYTEST_FAILING_FORK",
    "PYTEST_OPTIONS",
    "REFERENCE_ARGS",
    "ROOT",
    "DirectoryRun",
    "clean_env",
    "failure_section",
    "pytest_failing_run_group",
    "reference_run_group",
    "run_command",
    "run_from_empty_dir",
    "run_in_process",
    "run_torchrun",
    "shared_torchrun",
]

ROOT = Path(__file__).resolve().parents[2]
#: The command against the reference on two core gather checks in a world of 2. One run started in an empty
#: directory serves test_cli (its exit status and table) and test_hypothesis_storage (where it leaves hypothesis's
#: files): the ``command_from_empty_dir`` fixture runs it once for the tests of ``reference_run_group``.
REFERENCE_ARGS = ("--tier", "core", "-k", "matches", "--world-sizes", "2", "--max-examples", "3", "-q")
#: The xdist group of the tests reading the run of ``REFERENCE_ARGS``, kept in one worker so that it runs once.
reference_run_group = pytest.mark.xdist_group(name="reference_run")
#: ``pytest conformance/`` on a gather fork dropping its own rows (its forward check fails, its uneven one is not
#: supported), in worlds of 2 with few examples. One run started in an empty directory serves test_pytest_mode (the
#: failing and skipped tests) and test_hypothesis_storage (where it leaves hypothesis's files): the
#: ``python_from_empty_dir`` fixture runs it once for the tests of ``pytest_failing_run_group``.
PYTEST_FAILING_FORK = (
    "--conformance-gather", "tests.forks.broken_gather_drops_own_rows", "-k", "forward_matches or uneven_gathers",
    "-rfs",
)
#: pytest's options of every run of ``pytest conformance/`` in these tests, and the suite's: worlds of 2, few examples.
PYTEST_OPTIONS = ("-p", "no:randomly", "-p", "no:cacheprovider", "-q")
CONFORMANCE_OPTIONS = ("--dist-world-sizes", "2", "--conformance-max-examples", "3")
PYTEST_FAILING_ARGS = (
    "-m", "pytest", str(ROOT / "conformance"), *PYTEST_OPTIONS, *CONFORMANCE_OPTIONS, *PYTEST_FAILING_FORK,
)
#: The xdist group of the tests reading the run of ``PYTEST_FAILING_ARGS``.
pytest_failing_run_group = pytest.mark.xdist_group(name="pytest_failing_run")


class DirectoryRun(NamedTuple):
    """A run of ``python`` started in the empty directory ``cwd``, with the empty directory ``cache`` its cache."""

    result: subprocess.CompletedProcess[str]
    cwd: Path
    cache: Path


def clean_env() -> dict[str, str]:
    """This environment without torchrun's variables or PYTEST_ADDOPTS (so a child starts its own world)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def failure_section(stdout: str) -> list[str]:
    """The lines of the report's Failures section up to its summary line (times left out: they vary)."""
    lines = stdout.splitlines()
    start = lines.index("Failures")
    return [line for line in lines[start:] if not line.endswith("-> DOES NOT CONFORM (exit 1)")]


def run_command(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m nemo_dist.conformance *args`` in the checkout root (``env`` added); stdout and stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "nemo_dist.conformance", *args],
        cwd=ROOT, env={**clean_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False,
    )


def run_from_empty_dir(base: Path, *args: str) -> DirectoryRun:
    """``python *args`` started in a new empty directory under ``base``, this checkout importable.

    Its XDG_CACHE_HOME is another new empty directory under ``base``.
    """
    cwd, cache = base / "cwd", base / "cache"
    cwd.mkdir()
    cache.mkdir()
    env = {**clean_env(), "XDG_CACHE_HOME": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    return DirectoryRun(result, cwd, cache)


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The command line ``*args`` run through ``main(argv)`` in this process, read as ``run_command``'s result.

    For tests whose subject is the command's verdict and report, not its
    process: the worlds fork from this process's fork server, which has
    imported torch and the suites already, instead of a fresh interpreter
    importing them. The real process's exit statuses are test_cli's
    subprocess runs. Output printed before the call is dropped.

    Here pytest has rewritten the package's asserts (it loads the package as a
    plugin), so a failure's assertion message carries pytest's explanation:
    compare such text with another run in this process, not a subprocess's.
    """
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["nemo-dist-conformance", *args], code, out, err)


def run_torchrun(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node nproc -m nemo_dist.conformance *args`` in the checkout root."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
         "-m", "nemo_dist.conformance", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )


#: ``run_torchrun`` run once per process for given arguments: tests that read one run's output share it.
shared_torchrun = functools.cache(run_torchrun)
