"""The suite's test targets (transformers, nemo_automodel): skipped where missing, failures when required.

The README's test command installs both, so a test needing one should never
skip there: nemo-automodel is installed ``--no-deps``, and a transitive import
it lacks would otherwise turn its tests into quiet skips while the gate stays
green. ``pytest --require-targets`` (or ``NEMO_DIST_REQUIRE_TARGETS=1``) makes
"not importable" a failure naming the import error; without it a missing
target is a skip with the same words, for contributors who installed the
``test`` extra alone.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

__all__ = ["OPTION", "REQUIRE_ENV", "UPSTREAM_MODULES", "configure", "import_target", "missing_target", "required"]

OPTION = "--require-targets"
REQUIRE_ENV = "NEMO_DIST_REQUIRE_TARGETS"
#: The upstream modules the ``nemo_automodel`` preset and the upstream comparisons import.
UPSTREAM_MODULES = (
    "nemo_automodel.components.loss.dist_utils",
    "nemo_automodel.components.distributed.ddp",
    "nemo_automodel.components.distributed.config",
    "nemo_automodel.components.distributed.fsdp2",
    "nemo_automodel.components.distributed.utils",
    "nemo_automodel.components.distributed.parallelizer",
    "nemo_automodel.components.distributed.tp_replicas",
)

_required = False


def configure(config: pytest.Config) -> None:
    """Read the switch from ``config`` (option) or the environment; a bad environment value is a usage error."""
    global _required
    text = os.environ.get(REQUIRE_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise pytest.UsageError(
            f"{REQUIRE_ENV} expects 1 (fail tests whose transformers or nemo_automodel is not importable, "
            f"like {OPTION}) or 0; got {text!r}"
        )
    _required = text == "1" or bool(config.getoption("require_targets"))


def required() -> bool:
    """Whether a missing target fails the test (True) or skips it."""
    return _required


def missing_target(what: str) -> None:
    """Skip the running test (or module) for ``what`` is missing; fail it instead when targets are required."""
    if _required:
        pytest.fail(f"{what}; failed, not skipped, under {OPTION} / {REQUIRE_ENV}=1", pytrace=False)
    pytest.skip(what, allow_module_level=True)


def import_target(name: str, *, minversion: str | None = None) -> ModuleType:
    """Import module ``name``, or skip (fail when required) naming the import error or the version found."""
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        missing_target(f"{name} is not importable ({type(error).__name__}: {error})")
        raise  # unreachable: missing_target raises
    if minversion is not None:
        from packaging.version import Version

        found = getattr(module, "__version__", "0")
        if Version(found) < Version(minversion):
            missing_target(f"{name} {found} is installed; these tests need {minversion} or newer")
    return module
