"""Shared pytest configuration of the nemo_dist suite (keep it minimal).

Two options of the project's own suite (the ``nemo_dist`` plugin's options,
``--dist-*``, serve any suite):

* ``--require-targets`` (or ``NEMO_DIST_REQUIRE_TARGETS=1``): a test whose
  transformers or nemo_automodel is not importable fails, naming the import
  error, instead of skipping (:mod:`tests.targets`). The README's test
  command and CI set it.
* ``--thorough``: also run the tests marked ``thorough``, the exhaustive
  matrix the gate leaves out because another test in the gate already proves
  the same property more cheaply (the reference's ddp checks through both
  entry points, real models at every world size). Without it they are
  deselected, and counted as such. The scheduled CI job and ``tox -e
  thorough`` run them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

# pytester's in-process runs (tests/conformance/test_pytest_mode.py and others) remove afterwards the modules a run
# imported; torch's FSDP2 (which the pytest plugin's option check imports with the fsdp2 component) registers a
# torch library that cannot be registered twice in one process. Imported here, before any such run, it stays.
import torch.distributed.fsdp  # noqa: F401

from tests import targets

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--require-targets`` and ``--thorough``."""
    parser.addoption(
        targets.OPTION,
        dest="require_targets",
        action="store_true",
        default=False,
        help="fail (not skip) tests whose transformers or nemo_automodel is not importable "
        f"(also enabled by {targets.REQUIRE_ENV}=1)",
    )
    parser.addoption(
        "--thorough",
        action="store_true",
        default=False,
        help="also run the tests marked thorough (the exhaustive matrix the gate leaves out)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``thorough`` marker; read the targets switch."""
    config.addinivalue_line(
        "markers",
        "thorough: the exhaustive matrix, deselected unless --thorough (the gate proves each property more cheaply)",
    )
    targets.configure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``thorough`` tests unless ``--thorough`` was given."""
    if config.getoption("thorough"):
        return
    kept = [item for item in items if item.get_closest_marker("thorough") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("thorough")])
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection left alive (torch, transformers, upstream, every test item): it lives as long as the
    session, and a full garbage collection, which the checks' hypothesis runs trigger again and again in this
    process, then no longer walks it."""
    gc.freeze()


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester whose runs, in this process or a subprocess, load the harness plugin as this project's own runs do
    (the plugin is opt-in: pyproject's addopts name it here, and a pytester run reads no pyproject of ours)."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p nemo_dist.testing.plugin")
    return pytester


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
