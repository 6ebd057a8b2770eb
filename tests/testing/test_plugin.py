"""Harness layer 2 (pytest plugin through pytester): fixtures, markers, options, profiles.

Each test writes a small test file, runs pytest on it in-process (or in a
subprocess where a fresh interpreter matters) and matches the outcome lines.
"""

from __future__ import annotations

import re

import pytest

_RANK_FILE = """
import pytest
import torch.distributed as dist

def rank_and_size():
    return dist.get_rank(), dist.get_world_size()

def test_ranks(dist_world):
    size = dist_world.size
    assert dist_world.run(rank_and_size) == [(r, size) for r in range(size)]

@pytest.mark.world_sizes(2, 3)
def test_restricted(dist_world):
    assert dist_world.size in (2, 3)

@pytest.mark.world_sizes(7)
def test_nothing_left(dist_world):
    raise AssertionError("must not run")

def test_group(request, dist_world):
    mark = request.node.get_closest_marker("xdist_group")
    assert mark.kwargs == {"name": f"nemo_dist_gloo_w{dist_world.size}"}

def test_plain(request):
    assert request.node.get_closest_marker("xdist_group") is None

def test_factory(world_factory):
    assert world_factory(2) is world_factory(2)
    assert world_factory(2).run(rank_and_size) == [(0, 2), (1, 2)]
"""


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_dist_world_is_parametrized_by_selected_sizes(pytester: pytest.Pytester) -> None:
    """dist_world runs per --dist-world-sizes, intersected with world_sizes (empty: skip), one xdist_group per world."""
    pytester.makepyfile(test_ranks=_RANK_FILE)
    result = pytester.runpytest("--dist-world-sizes=1,2", "-v", "-rs", "--strict-markers")
    result.stdout.fnmatch_lines_random(
        [
            "*test_ranks[[]w1[]] PASSED*",
            "*test_ranks[[]w2[]] PASSED*",
            "*test_restricted[[]w2[]] PASSED*",
            "*test_factory PASSED*",
            "*test_group[[]w2[]] PASSED*",
            "*no world size left: world_sizes(7,) and --dist-world-sizes=1,2 do not intersect*",
        ]
    )
    result.assert_outcomes(passed=7, skipped=1)
    assert "test_restricted[w1]" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dist-world-sizes=1,x"], "*--dist-world-sizes expects a comma-separated list*got '1,x'*"),
        (["--dist-world-sizes=0"], "*--dist-world-sizes expects*such as --dist-world-sizes=1,2,4*"),
        (["--dist-timeout=soon"], "*--dist-timeout expects a number of seconds > 0*got 'soon'*"),
        (["--dist-timeout=-3"], "*--dist-timeout expects a number of seconds > 0*"),
        (["--dist-max-gpus=0"], "*--dist-max-gpus expects a number of GPUs >= 1*got '0'*"),
    ],
    ids=["sizes-not-int", "sizes-zero", "timeout-not-number", "timeout-negative", "max-gpus-zero"],
)
def test_malformed_option_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    """A malformed --dist-* option stops pytest with a UsageError saying the fix."""
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


_PROFILE_FILE = """
from hypothesis import settings

def test_profile():
    print("PROFILE", settings.get_current_profile_name(), settings.default.max_examples)
"""


@pytest.mark.usefixtures("keep_hypothesis_profile")
@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], None, "PROFILE ci 25"),
        (["--hypothesis-profile=thorough"], None, "PROFILE thorough 500"),
        ([], "dev", "PROFILE dev 50"),
        (["--hypothesis-profile=thorough"], "dev", "PROFILE thorough 500"),
    ],
    ids=["default-ci", "option", "env", "option-beats-env"],
)
def test_hypothesis_profile_choice(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: str | None,
    expected: str,
) -> None:
    """ci by default; HYPOTHESIS_PROFILE or --hypothesis-profile win, the option first."""
    if env is None:
        monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    else:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", env)
    pytester.makepyfile(test_profile=_PROFILE_FILE)
    result = pytester.runpytest("-s", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*{expected}*"])


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_unknown_profile_in_env_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """HYPOTHESIS_PROFILE naming no profile stops pytest, listing the valid names."""
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly-typo")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'nightly-typo' is not a registered*ci, dev, thorough*"])


_SHRINK_FILE = """
import pytest
import torch.distributed as dist
from hypothesis import given, strategies as st

def check(values):
    mine = values[dist.get_rank()]
    assert mine <= 10, f"rank {dist.get_rank()} got {mine}"

@pytest.mark.world_sizes(2)
@given(values=st.lists(st.integers(0, 1000), min_size=2, max_size=2))
def test_property(dist_world, values):
    dist_world.run(check, values)
"""


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_hypothesis_shrinks_a_failure_across_ranks(pytester: pytest.Pytester) -> None:
    """A per-rank property failure shrinks to the minimal example through the World."""
    pytester.makepyfile(test_shrink=_SHRINK_FILE)
    result = pytester.runpytest("--dist-world-sizes=2", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(r"Falsifying example|Failing test case", out), out
    assert re.search(r"values=\[(0, 11|11, 0)\]", out), out
    assert re.search(r"rank \d raised AssertionError: rank \d got 11", out)


_HANG_FILE = """
import pytest
import torch.distributed as dist

def hang_on_rank_one():
    if dist.get_rank() == 1:
        dist.barrier()

@pytest.mark.world_sizes(2)
def test_hangs(dist_world):
    dist_world.run(hang_on_rank_one)

@pytest.mark.world_sizes(2)
def test_after(dist_world):
    assert dist_world.run(dist.get_rank) == [0, 1]
"""


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_hang_fails_the_test_with_stacks_and_the_next_test_passes(pytester: pytest.Pytester) -> None:
    """Under --dist-timeout a hung rank fails its test with its barrier stack; the next test passes."""
    pytester.makepyfile(test_hang=_HANG_FILE)
    result = pytester.runpytest("--dist-timeout=1.5", "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*WorldTimeout: rank 1 of 2 did not finish within 1.5 s running test_hang.hang_on_rank_one*",
            "*--- rank 1 stack ---*",
            "*in barrier*",
        ]
    )


_GROUPED_FILE = """
import os
from pathlib import Path

import pytest

@pytest.mark.xdist_group(name="one_world")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    Path(f"ran_{i}_on_{os.environ['PYTEST_XDIST_WORKER']}").touch()

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
"""


def test_xdist_loadgroup_keeps_one_group_on_one_worker(pytester: pytest.Pytester) -> None:
    """--dist loadgroup sends every test of an xdist_group to one worker: the plugin's per-world groups rely on it.

    pytest 9.2.0 with pytest-xdist 3.8.0 silently stops grouping (pytest-xdist
    issue 1386: the group suffix xdist writes into node ids no longer takes
    effect), so every worker would start every world, and tests sharing one
    run would repeat it; the ``test`` extra keeps pytest below 9.2 until a
    release of xdist groups again. This test says so if grouping breaks.
    """
    pytester.makepyfile(test_grouped=_GROUPED_FILE)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    ran = sorted(p.name for p in pytester.path.glob("ran_*"))
    assert len(ran) == 4, ran
    workers = {name.rsplit("_on_", 1)[1] for name in ran}
    assert len(workers) == 1, (
        f"the 4 tests of one xdist_group ran on workers {sorted(workers)}: --dist loadgroup does not group "
        "(pytest-xdist issue 1386 with pytest 9.2)\n" + result.stdout.str()
    )


_PRELOAD_FILE = """
import os

def importer():
    from tests.testing import _preloaded_by_ini
    return _preloaded_by_ini.IMPORTED_BY, os.getpid(), os.getppid()

def test_preloaded(dist_world):
    for imported_by, pid, parent in dist_world.run(importer):
        assert imported_by == parent != pid
"""


def test_dist_preload_modules_are_imported_once_by_the_process_the_ranks_fork_from(pytester: pytest.Pytester) -> None:
    """Every rank of a session World finds the ``dist_preload`` modules imported by the fork server it came from
    (its parent), not by itself. The module is one nothing else imports first."""
    pytester.makepyfile(test_preload=_PRELOAD_FILE)
    pytester.makeini("[pytest]\ndist_preload = tests.testing._preloaded_by_ini\n")
    result = pytester.runpytest("--dist-world-sizes=2", "-p", "nemo_dist.testing.plugin")
    result.assert_outcomes(passed=1)
