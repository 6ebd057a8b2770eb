"""Run the conformance command as a subprocess from the checkout root, or in this process (helper of the CLI tests)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_dist.conformance.cli import main

__all__ = [
    "ROOT",
    "clean_env",
    "failure_section",
    "run_command",
    "run_in_process",
    "run_torchrun",
    "shared_torchrun",
]

ROOT = Path(__file__).resolve().parents[2]


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
