"""Run the conformance command as a subprocess from the checkout root (helper of the CLI tests)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "clean_env", "failure_section", "run_command", "run_torchrun", "shared_command", "shared_torchrun"]

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


def run_torchrun(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node nproc -m nemo_dist.conformance *args`` in the checkout root."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
         "-m", "nemo_dist.conformance", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )


#: ``run_command`` run once per process for given arguments: tests that read one run's output share it.
shared_command = functools.cache(run_command)
#: ``run_torchrun`` run once per process for given arguments, likewise.
shared_torchrun = functools.cache(run_torchrun)
