"""Harness layer 2 (pytest plugin through pytester): the gpu marker, --dist-require-gpu and --dist-max-gpus.

On a machine without CUDA, gpu tests skip with a reason, or fail under the
require switch; an NCCL world larger than the visible (or allowed) GPUs
skips; a require-gpu run that selected no gpu test exits non-zero.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_gpu_tests_skip_with_a_reason_without_cuda(pytester: pytest.Pytester) -> None:
    """gpu-marked tests (with or without dist_world) skip on a CPU machine, never fail."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_plain():
            raise AssertionError("must not run")

        @pytest.mark.gpu
        def test_world(dist_world):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--dist-world-sizes=2", "-rs", "--strict-markers")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*gpu test: CUDA is not available*"])


_GPU_FILE = """
import pytest

@pytest.mark.gpu
def test_plain():
    pass

@pytest.mark.gpu
def test_world(dist_world):
    pass
"""

_CUDA_MISSING = "gpu test: CUDA is not available (torch.cuda.is_available() is False)"
_CUDA_REQUIRED = f"{_CUDA_MISSING}; failed, not skipped, under --dist-require-gpu / NEMO_DIST_REQUIRE_GPU=1"


@pytest.fixture
def no_gpu_switch(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Clear the outer environment's GPU switches, so each inner run sets its own."""
    monkeypatch.delenv("NEMO_DIST_REQUIRE_GPU", raising=False)
    monkeypatch.delenv("NEMO_DIST_FAKE_GPU_COUNT", raising=False)
    return monkeypatch


@pytest.mark.usefixtures("keep_hypothesis_profile")
@pytest.mark.parametrize(
    ("args", "env", "outcomes", "line"),
    [
        ([], None, {"skipped": 2}, f"SKIPPED *{_CUDA_MISSING}*"),
        (["--dist-require-gpu"], None, {"errors": 2}, _CUDA_REQUIRED),
        ([], "1", {"errors": 2}, _CUDA_REQUIRED),
    ],
    ids=["no-switch-skips", "option-fails", "env-fails"],
)
def test_gpu_tests_without_cuda_skip_or_fail_under_the_switch(
    pytester: pytest.Pytester,
    no_gpu_switch: pytest.MonkeyPatch,
    args: list[str],
    env: str | None,
    outcomes: dict[str, int],
    line: str,
) -> None:
    """Without CUDA gpu tests skip naming it; --dist-require-gpu or NEMO_DIST_REQUIRE_GPU=1 fails them instead."""
    no_gpu_switch.setenv("NEMO_DIST_FAKE_GPU_COUNT", "0")
    if env is not None:
        no_gpu_switch.setenv("NEMO_DIST_REQUIRE_GPU", env)
    pytester.makepyfile(test_gpu=_GPU_FILE)
    result = pytester.runpytest("--dist-world-sizes=2", "-rs", "--strict-markers", *args)
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines([line])


_TWO_GPU_FILE = """
import pytest

@pytest.mark.gpu
def test_two_gpus(world_factory):
    world_factory(2, "nccl")
    raise AssertionError("must not get a world")
"""


@pytest.mark.usefixtures("keep_hypothesis_profile")
@pytest.mark.parametrize(
    ("args", "outcomes", "line"),
    [
        ([], {"skipped": 1}, "SKIPPED *gpu test: an NCCL world of 2 needs 2 GPUs, 1 visible"),
        (["--dist-require-gpu"], {"failed": 1}, "gpu test: an NCCL world of 2 needs 2 GPUs, 1 visible; failed, not*"),
    ],
    ids=["no-switch-skips", "switch-fails"],
)
def test_an_nccl_world_larger_than_the_visible_gpus(
    pytester: pytest.Pytester,
    no_gpu_switch: pytest.MonkeyPatch,
    args: list[str],
    outcomes: dict[str, int],
    line: str,
) -> None:
    """With 1 GPU visible, world_factory(2, "nccl") says it needs 2 GPUs: a skip, or a failure under the switch."""
    no_gpu_switch.setenv("NEMO_DIST_FAKE_GPU_COUNT", "1")
    pytester.makepyfile(test_two=_TWO_GPU_FILE)
    result = pytester.runpytest("-rs", *args)
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines([line])


_ABOVE_THE_BOUND = "SKIPPED *gpu test: an NCCL world of 2 needs 2 GPUs, above --dist-max-gpus=1"


@pytest.mark.usefixtures("keep_hypothesis_profile")
@pytest.mark.parametrize(
    ("visible", "outcomes", "line"),
    [
        ("1", {"skipped": 1}, _ABOVE_THE_BOUND),
        ("4", {"skipped": 1}, _ABOVE_THE_BOUND),
        ("0", {"errors": 1}, _CUDA_REQUIRED),
    ],
    ids=["one-visible", "four-visible", "no-cuda-still-fails"],
)
def test_max_gpus_skips_larger_nccl_worlds_even_under_the_switch(
    pytester: pytest.Pytester,
    no_gpu_switch: pytest.MonkeyPatch,
    visible: str,
    outcomes: dict[str, int],
    line: str,
) -> None:
    """--dist-max-gpus=1 skips a world of 2, naming the bound, under --dist-require-gpu; missing CUDA still fails."""
    no_gpu_switch.setenv("NEMO_DIST_FAKE_GPU_COUNT", visible)
    pytester.makepyfile(test_two=_TWO_GPU_FILE)
    result = pytester.runpytest("-rs", "--dist-require-gpu", "--dist-max-gpus=1")
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines([line])


_NO_GPU_TEST_MESSAGE = "ERROR: --dist-require-gpu / NEMO_DIST_REQUIRE_GPU=1: no gpu test was selected*"


@pytest.mark.usefixtures("keep_hypothesis_profile")
@pytest.mark.parametrize(
    ("args", "outcomes"),
    [([], {"passed": 1}), (["-m", "gpu"], {"deselected": 1})],
    ids=["plain-tests-only", "marker-matches-nothing"],
)
def test_require_gpu_run_without_gpu_tests_exits_non_zero(
    pytester: pytest.Pytester, no_gpu_switch: pytest.MonkeyPatch, args: list[str], outcomes: dict[str, int]
) -> None:
    """Under NEMO_DIST_REQUIRE_GPU=1 a run that selects no gpu test exits non-zero, saying so, even if all passed."""
    no_gpu_switch.setenv("NEMO_DIST_REQUIRE_GPU", "1")
    pytester.makepyfile("def test_cpu(): pass")
    result = pytester.runpytest(*args)
    result.assert_outcomes(**outcomes)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([_NO_GPU_TEST_MESSAGE])


@pytest.mark.usefixtures("keep_hypothesis_profile")
def test_require_gpu_run_with_a_passing_gpu_test_exits_zero(
    pytester: pytest.Pytester, no_gpu_switch: pytest.MonkeyPatch
) -> None:
    """Under --dist-require-gpu a selected gpu test whose GPUs are there runs; the run exits 0 with no complaint."""
    no_gpu_switch.setenv("NEMO_DIST_FAKE_GPU_COUNT", "2")
    pytester.makepyfile("import pytest\n\n@pytest.mark.gpu\ndef test_gpu(): pass\n\ndef test_cpu(): pass\n")
    result = pytester.runpytest("--dist-require-gpu", "-m", "gpu")
    result.assert_outcomes(passed=1, deselected=1)
    assert result.ret == pytest.ExitCode.OK
    assert "no gpu test was selected" not in result.stdout.str()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (("NEMO_DIST_REQUIRE_GPU", "yes"), "*NEMO_DIST_REQUIRE_GPU expects 1 (fail gpu tests*) or 0; got 'yes'*"),
        (("NEMO_DIST_FAKE_GPU_COUNT", "two"), "*NEMO_DIST_FAKE_GPU_COUNT (a testing seam*>= 0; got 'two'*"),
    ],
    ids=["require-gpu-not-0-or-1", "fake-count-not-int"],
)
def test_malformed_gpu_environment_is_a_usage_error(
    pytester: pytest.Pytester, no_gpu_switch: pytest.MonkeyPatch, env: tuple[str, str], message: str
) -> None:
    """A malformed NEMO_DIST_REQUIRE_GPU or NEMO_DIST_FAKE_GPU_COUNT stops pytest with a UsageError saying what fits."""
    no_gpu_switch.setenv(*env)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("test_file", "status"),
    [
        ("import pytest\n\n@pytest.mark.gpu\ndef test_gpu(): pass\n", pytest.ExitCode.OK),
        ("def test_cpu(): pass\n", pytest.ExitCode.NO_TESTS_COLLECTED),
    ],
    ids=["gpu-test-on-a-worker", "no-gpu-test-on-any-worker"],
)
def test_require_gpu_counts_the_gpu_tests_of_xdist_workers(
    pytester: pytest.Pytester, no_gpu_switch: pytest.MonkeyPatch, test_file: str, status: pytest.ExitCode
) -> None:
    """Under xdist the controller adds up its workers' gpu tests: one selected is enough, none fails the run."""
    no_gpu_switch.setenv("NEMO_DIST_FAKE_GPU_COUNT", "1")
    # The workers import nemo_dist afresh: this checkout's, as the rank processes do.
    repo = str(Path(__file__).resolve().parents[2])
    no_gpu_switch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(test_file)
    result = pytester.runpytest("-n", "1", "--dist-require-gpu")
    result.assert_outcomes(passed=1)
    assert result.ret == status
    assert ("no gpu test was selected" in result.stdout.str()) == (status != pytest.ExitCode.OK)
