"""Layer 3: ``pytest conformance/`` as a subprocess, in gloo worlds of 2 ranks: the checks as pytest tests.

Usage errors run in this process (``pytester``): they stop pytest before any world starts.
"""

from __future__ import annotations

import functools
import shlex
import subprocess
import sys

import pytest

# Imported here, before any in-process run: pytester removes afterwards the modules a run imported, and
# torch cannot be imported twice in one process.
import nemo_dist.conformance.pytest_plugin  # noqa: F401
from tests.conformance._cli import ROOT, clean_env


def _pytest_conformance(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
         "--dist-world-sizes", "2", "--conformance-max-examples", "3", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=240, check=False,
    )


#: One failing run, read by the two tests that use it (kept in one xdist worker, so it runs once).
_failing_group = pytest.mark.xdist_group(name="pytest_mode_failing_run")
_FAILING = (
    "--conformance-gather", "tests.forks.broken_gather_drops_own_rows",
    "-k", "forward_matches or uneven_gathers", "-rfs",
)


@functools.cache
def _failing_run() -> subprocess.CompletedProcess[str]:
    return _pytest_conformance(*_FAILING)


@_failing_group
def test_checks_run_as_pytest_tests_failing_and_skipping_per_check() -> None:
    """A broken fork fails its check's test with the falsifying example; a missing keyword is a skip."""
    result = _failing_run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED conformance/test_conformance.py::test_check_holds[gather.forward_matches_cat-w2]" in result.stdout
    assert "Failing test case" in result.stdout
    assert "not supported: needs uneven=: tests.forks.broken_gather_drops_own_rows.all_gather_with_grad " \
        "takes no uneven= keyword" in result.stdout
    assert "1 failed, 1 skipped" in result.stdout


def _usage_error(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run ``pytest conformance/`` in this process with ``args``, which must stop it with a usage error (exit 4).

    In-process: a usage error stops pytest before any world starts, so a fresh interpreter would only add its
    imports; the real command's own exit status is ``test_cli.py``'s.
    """
    # The plugin module is imported above, so the inner run cannot rewrite its asserts and warns so; under the
    # project's warnings-as-errors that warning alone would end the run as an internal error.
    result = pytester.runpytest_inprocess(
        str(ROOT / "conformance"), "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    return result


def test_unimportable_module_is_a_pytest_usage_error(pytester: pytest.Pytester) -> None:
    """A module that does not import stops pytest with a usage error naming it."""
    result = _usage_error(pytester, "--conformance-ddp", "tests.forks.no_such_fork")
    assert "--conformance-ddp module 'tests.forks.no_such_fork' does not import" in result.stderr.str()


def test_bad_min_deadline_is_a_pytest_usage_error(pytester: pytest.Pytester) -> None:
    """--conformance-min-deadline takes seconds; anything else stops pytest naming the option and an example."""
    result = _usage_error(pytester, "--conformance-min-deadline", "soon")
    assert "--conformance-min-deadline expects a number of seconds > 0" in result.stderr.str()


def test_a_forks_deprecation_warning_is_a_summary_note_not_a_failure() -> None:
    """The upstream-faithful DDPManager warns that it is deprecated: the tests pass and the warning is listed."""
    result = _pytest_conformance(
        "--conformance-ddp", "tests.forks.upstream_faithful_ddp",
        "--conformance-config", "tests.forks.upstream_faithful_config",
        "-k", "manager_attributes",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "DeprecationWarning: DDPManager is deprecated" in result.stdout


def _error_lines(stdout: str) -> list[str]:
    """The lines pytest printed for the failing test's exception and its notes (its ``E`` lines), unprefixed."""
    return [line[1:].strip() for line in stdout.splitlines() if line.startswith("E ")]


def _failing_example(stdout: str) -> list[str]:
    """The assertion, falsifying example and likely cause pytest printed for the failing test."""
    lines = _error_lines(stdout)
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("Reproduce: pytest "))]


@_failing_group
def test_a_failing_check_prints_the_pytest_line_that_reproduces_it_alone() -> None:
    """The failure ends with its node id, options, world size and seed; that line re-runs it to the same example."""
    result = _failing_run()
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [x for x in _error_lines(result.stdout) if x.startswith("Reproduce: pytest ")]
    assert line.startswith(
        "Reproduce: pytest 'conformance/test_conformance.py::test_check_holds[gather.forward_matches_cat-w2]' "
        "--conformance-gather tests.forks.broken_gather_drops_own_rows --conformance-max-examples 3 "
        "--dist-world-sizes 2 --hypothesis-seed="
    ), line
    args = shlex.split(line.removeprefix("Reproduce: "))[1:]
    again = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=240, check=False,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert "1 failed" in again.stdout, again.stdout
    example = _failing_example(result.stdout)
    assert "Failing test case: prop(" in example, result.stdout
    assert _failing_example(again.stdout) == example, again.stdout


@pytest.mark.thorough  # the command's run: test_signatures; the pytest options come from the same table
def test_gather_call_options_make_a_sized_gather_checkable_under_pytest() -> None:
    """--conformance-gather-kwarg dim=0 and --conformance-gather-output 0 call gather_with_sizes as the command does."""
    result = _pytest_conformance(
        "--conformance-gather-fn", "tests.forks.gallery_gather_with_sizes:gather_with_sizes",
        "--conformance-gather-kwarg", "dim=0", "--conformance-gather-output", "0",
        "--conformance-tier", "core", "-k", "forward_matches_cat or backward_sums",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--conformance-gather-fn tests.forks.gallery_gather_with_sizes:gather_with_sizes has required "
             "keyword-only parameter 'dim' that no option fills; pass it on every call with "
             "--conformance-gather-kwarg dim=VALUE"),
        (("--conformance-gather-kwarg", "dim=zero"), "--conformance-gather-kwarg 'dim=zero': 'zero' is not a Python"),
        (("--conformance-gather-kwarg", "dim=0", "--conformance-gather-output", "-1"),
         "--conformance-gather-output expects the index (>= 0)"),
        (("--conformance-gather-kwarg", "dim=0", "--conformance-gather-init", "dim=0"),
         "--conformance-gather-init applies to a class that is built, then called (such as an nn.Module)"),
    ],
    ids=["missing-dim", "not-a-literal", "negative-output", "init-on-a-function"],
)
def test_bad_gather_call_options_are_pytest_usage_errors(
    args: tuple[str, ...], message: str, pytester: pytest.Pytester
) -> None:
    """A required parameter left unfilled, or a bad kwarg or index, stops pytest with a usage error naming it."""
    result = _usage_error(
        pytester, "--conformance-gather-fn", "tests.forks.gallery_gather_with_sizes:gather_with_sizes", *args
    )
    assert message in result.stderr.str()


@pytest.mark.thorough  # the command's: test_signatures; the option is worded per front end from one table
def test_a_hidden_missing_parameter_fails_with_the_option_to_fill_it() -> None:
    """Behind a decorator hiding dim, each failing test names the parameter and --conformance-gather-kwarg."""
    result = _pytest_conformance(
        "--conformance-gather-fn", "tests.forks.gallery_gather_with_sizes:timed_gather_with_sizes",
        "-k", "forward_matches_cat",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Likely cause: tests.forks.gallery_gather_with_sizes:timed_gather_with_sizes was called without its " \
        "required parameter 'dim'; pass it on every call with --conformance-gather-kwarg dim=VALUE" in result.stdout


def test_bad_ddp_fn_options_are_pytest_usage_errors_worded_for_pytest(pytester: pytest.Pytester) -> None:
    """A --conformance-ddp-fn misuse stops pytest before any world starts, naming the pytest options."""
    result = _usage_error(
        pytester, "--conformance-ddp-fn", "tests.forks.gallery_ddp_fairseq:DistributedFairseqModel"
    )
    assert "--conformance-ddp-fn tests.forks.gallery_ddp_fairseq:DistributedFairseqModel has required parameter " \
        "'args' that no option fills; pass it on every call with --conformance-ddp-kwarg args=VALUE" \
        in result.stderr.str()


_SUMMED = ("--conformance-ddp-fn", "tests.forks.gallery_ddp_summed:DataParallel",
           "-k", "wrapper and (trains_like_one_process or ranks_stay_identical)")


@pytest.mark.thorough  # the same wrapper's cause: test_gallery_ddp's "summed" row (in process); options: one table
def test_a_ddp_fn_wrapper_fails_under_pytest_with_its_likely_cause() -> None:
    """A wrapper summing gradients, held to the default mean, fails training under pytest with that cause."""
    from nemo_dist.conformance.wrapper.diagnosis import CAUSES

    result = _pytest_conformance(*_SUMMED)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED conformance/test_conformance.py::test_check_holds[wrapper.trains_like_one_process-w2]" \
        in result.stdout, result.stdout
    assert f"Likely cause: {CAUSES['sum_for_mean']}" in result.stdout, result.stdout
    assert "1 failed, 1 passed" in result.stdout, result.stdout


@pytest.mark.thorough  # both front ends read these options from one table (test_option_table); the command runs them
def test_ddp_fn_step_options_reach_the_checks_under_pytest() -> None:
    """The same wrapper declared with --conformance-ddp-reduction sum conforms; so does a Megatron-style wrapper
    stepped through --conformance-ddp-after-backward, -grad-attr and -zero-grad."""
    summed = _pytest_conformance(*_SUMMED, "--conformance-ddp-reduction", "sum")
    assert summed.returncode == 0, summed.stdout + summed.stderr
    assert "2 passed" in summed.stdout, summed.stdout
    megatron = _pytest_conformance(
        "--conformance-ddp-fn", "tests.forks.gallery_ddp_megatron:DistributedDataParallel",
        "--conformance-ddp-kwarg", "ddp_config={}", "--conformance-ddp-after-backward", "finish_grad_sync",
        "--conformance-ddp-grad-attr", "main_grad", "--conformance-ddp-zero-grad", "zero_grad_buffer",
        "-k", "wrapper and trains_like_one_process",
    )
    assert megatron.returncode == 0, megatron.stdout + megatron.stderr
    assert "1 passed" in megatron.stdout, megatron.stdout
