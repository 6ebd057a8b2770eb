"""Fixtures shared by the conformance tests' modules."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from tests.conformance._cli import DirectoryRun, run_from_empty_dir


@pytest.fixture(scope="session")
def python_from_empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., DirectoryRun]:
    """``(*args) -> DirectoryRun``: ``python *args`` started in an empty directory, this checkout importable.

    Run once per session (per xdist worker) for the same ``args``: tests that
    read one run share it, in one xdist group so that it runs once. Each run
    has an empty directory and an empty cache directory of its own
    (:func:`~tests.conformance._cli.run_from_empty_dir`).
    """

    @functools.cache
    def run(*args: str) -> DirectoryRun:
        return run_from_empty_dir(tmp_path_factory.mktemp("python_from_empty_dir"), *args)

    return run


@pytest.fixture(scope="session")
def command_from_empty_dir(python_from_empty_dir: Callable[..., DirectoryRun]) -> Callable[..., DirectoryRun]:
    """``(*args) -> DirectoryRun``: ``python -m nemo_dist.conformance *args`` started in an empty directory.

    Shared as :func:`python_from_empty_dir` shares its runs.
    """
    return functools.partial(python_from_empty_dir, "-m", "nemo_dist.conformance")
