"""Fixtures shared by the conformance tests' modules."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from tests.conformance._cli import DirectoryRun, run_from_empty_dir


@pytest.fixture(scope="session")
def command_from_empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., DirectoryRun]:
    """``(*args) -> DirectoryRun``: ``python -m nemo_dist.conformance *args`` started in an empty directory.

    Run once per session (per xdist worker) for the same ``args``: tests that
    read one run share it, in one xdist group so that it runs once. Each run
    has an empty directory and an empty cache directory of its own
    (:func:`~tests.conformance._cli.run_from_empty_dir`).
    """

    @functools.cache
    def run(*args: str) -> DirectoryRun:
        base = tmp_path_factory.mktemp("command_from_empty_dir")
        return run_from_empty_dir(base, "-m", "nemo_dist.conformance", *args)

    return run
