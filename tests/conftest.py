"""Shared pytest configuration of the nemo_dist suite (keep it minimal)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def _session_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's own XDG_CACHE_HOME, for it and every process it starts.

    Conformance runs keep hypothesis's example database in the user's cache
    by default, and replay what it holds first. Shared, a test's verdict would
    depend on what earlier runs (or another xdist worker) saved there; and
    the suite would fill the user's cache.
    """
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
    yield
    patch.undo()
