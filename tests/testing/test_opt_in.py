"""Harness layer 2 (pytest in a subprocess): installing nemo-dist changes no other project's pytest run.

The harness plugin has no ``pytest11`` entry point: a project's run loads it
only when the project asks (``-p nemo_dist.testing.plugin``, or its conftest's
``pytest_plugins``). An unrelated project, with a ``gpu`` marker of its own
and a hypothesis test, runs here in a fresh pytest process of this
environment, where nemo-dist is installed.
"""

from __future__ import annotations

import pytest

from nemo_dist.testing import gpus

_UNRELATED = """
import pytest
from hypothesis import settings


@pytest.mark.gpu
def test_the_projects_own_gpu_marker():
    pass


def test_hypothesis_profile():
    print("max_examples", settings().max_examples)
"""


@pytest.fixture
def unrelated(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project that knows nothing of nemo_dist, run without this suite's opt-in (no ``PYTEST_ADDOPTS``), on a
    machine without GPUs (the harness's own seam, read only where the plugin is loaded)."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.setenv(gpus.FAKE_GPU_COUNT_ENV, "0")
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the project's own marker\n")
    pytester.makepyfile(test_unrelated=_UNRELATED)
    return pytester


def test_an_unrelated_project_runs_as_if_nemo_dist_were_not_installed(unrelated: pytest.Pytester) -> None:
    """No nemo_dist plugin is active: its gpu test runs, hypothesis keeps its own default of 100 examples."""
    result = unrelated.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--trace-config")
    result.assert_outcomes(passed=2)
    assert "max_examples 100" in result.stdout.str()
    active = result.stdout.str()  # --trace-config lists every registered plugin with its module
    assert "nemo_dist.testing" not in active
    assert "nemo_dist.conformance" not in active


def test_a_project_that_opts_in_gets_the_harness(unrelated: pytest.Pytester) -> None:
    """With ``-p nemo_dist.testing.plugin`` the gpu marker is acted on and the ``ci`` profile is loaded."""
    result = unrelated.runpytest_subprocess("-s", "-p", "no:cacheprovider", "-p", "nemo_dist.testing.plugin", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert "max_examples 25" in result.stdout.str()
    result.stdout.fnmatch_lines(["*gpu test: CUDA is not available*"])
