"""Layer 3: ``pytest conformance/`` as a subprocess, in gloo worlds of 2 ranks: the checks as pytest tests.

The subprocess proves the real run: a broken fork fails its tests, exit 1
(the run starts in an empty directory: test_hypothesis_storage reads where it left hypothesis's files). What
the plugin decides and prints beyond that is checked in this process
(``pytester``): usage errors (they stop pytest before any world starts),
and runs whose worlds fork from this process's fork server, where a fresh
interpreter would import torch and the suites again.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable

import pytest

# Imported here, before any in-process run: pytester removes afterwards the modules a run imported, and
# torch cannot be imported twice in one process, nor a suite's checks registered twice.
import nemo_dist.conformance.frontends.pytest_plugin  # noqa: F401
from nemo_dist.conformance import load_checks
from tests.conformance._cli import (
    CONFORMANCE_OPTIONS,
    PYTEST_FAILING_ARGS,
    PYTEST_FAILING_FORK,
    PYTEST_OPTIONS,
    ROOT,
    DirectoryRun,
    clean_env,
    pytest_failing_run_group,
)

load_checks()

#: pytest's options of every run here: tests in file order (no pytest-randomly), no .pytest_cache, quiet.
_PYTEST = PYTEST_OPTIONS
#: The conformance suite in worlds of 2, with few examples.
_CONFORMANCE = ("conformance/", *CONFORMANCE_OPTIONS)


def _pytest_conformance(*args: str) -> subprocess.CompletedProcess[str]:
    """``pytest conformance/ *args`` as a subprocess in the checkout root (worlds of 2, few examples)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", *_PYTEST, *_CONFORMANCE, *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=240, check=False,
    )


#: A gather fork dropping its own rows: its forward check fails, its uneven one is not supported.
_FAILING = PYTEST_FAILING_FORK


@pytest_failing_run_group
def test_checks_run_as_pytest_tests_failing_and_skipping_per_check(
    python_from_empty_dir: Callable[..., DirectoryRun],
) -> None:
    """A broken fork fails its check's test with the falsifying example; a missing keyword is a skip.

    The run, started in an empty directory, is shared with test_hypothesis_storage (where it leaves its files).
    """
    result = python_from_empty_dir(*PYTEST_FAILING_ARGS).result
    assert result.returncode == 1, result.stdout + result.stderr
    # pytest names the test by its path from the cwd (the run starts in an empty directory) in the summary line.
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    test = "conformance/test_conformance.py::test_check_holds[gather.forward_matches_cat-w2]"
    assert [test in line for line in failed] == [True], result.stdout
    assert "Failing test case" in result.stdout
    assert "not supported: needs uneven=: tests.forks.broken_gather_drops_own_rows.all_gather_with_grad " \
        "takes no uneven= keyword" in result.stdout
    assert "1 failed, 1 skipped" in result.stdout


@pytest.fixture
def root_pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """``pytester`` whose in-process runs start in the checkout root and leave hypothesis's forced seed as it was.

    ``--hypothesis-seed`` sets that seed for the whole process; restored, the tests after a run draw as before.
    """
    from hypothesis import core

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(core, "global_force_seed", core.global_force_seed)
    return pytester


def _pytest_in_process(root_pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """``pytest *args`` run in this process from the checkout root, as a subprocess of it would run.

    For tests whose subject is what the plugin decides and prints, not pytest's process: a fresh interpreter
    would import torch and the suites again, where this one's worlds fork from its warm fork server. Here pytest
    has rewritten the package's asserts, so a failure's assertion message carries pytest's explanation: compare
    such text with another run in this process.
    """
    # The plugin module is imported above, so the inner run cannot rewrite its asserts and warns so; under the
    # project's warnings-as-errors that warning alone would end the run as an internal error.
    return root_pytester.runpytest_inprocess(*_PYTEST, "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def _usage_error(root_pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run ``pytest conformance/`` in this process with ``args``, which must stop it with a usage error (exit 4).

    In-process: a usage error stops pytest before any world starts, so a fresh interpreter would only add its
    imports; the real command's own exit status is ``test_cli.py``'s.
    """
    result = _pytest_in_process(root_pytester, "conformance/", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    return result


def test_unimportable_module_is_a_pytest_usage_error(root_pytester: pytest.Pytester) -> None:
    """A module that does not import stops pytest with a usage error naming it."""
    result = _usage_error(root_pytester, "--conformance-ddp", "tests.forks.no_such_fork")
    assert "--conformance-ddp module 'tests.forks.no_such_fork' does not import" in result.stderr.str()


def test_bad_min_deadline_is_a_pytest_usage_error(root_pytester: pytest.Pytester) -> None:
    """--conformance-min-deadline takes seconds; anything else stops pytest naming the option and an example."""
    result = _usage_error(root_pytester, "--conformance-min-deadline", "soon")
    assert "--conformance-min-deadline expects a number of seconds > 0" in result.stderr.str()


def test_a_forks_deprecation_warning_is_a_summary_note_not_a_failure(root_pytester: pytest.Pytester) -> None:
    """The upstream-faithful DDPManager warns that it is deprecated: the tests pass and the warning is listed."""
    result = _pytest_in_process(
        root_pytester, *_CONFORMANCE,
        "--conformance-ddp", "tests.forks.upstream_faithful_ddp",
        "--conformance-config", "tests.forks.upstream_faithful_config",
        "-k", "manager_attributes",
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert "1 passed" in result.stdout.str()
    assert "DeprecationWarning: DDPManager is deprecated" in result.stdout.str()


def _error_lines(stdout: str) -> list[str]:
    """The lines pytest printed for the failing test's exception and its notes (its ``E`` lines), unprefixed."""
    return [line[1:].strip() for line in stdout.splitlines() if line.startswith("E ")]


def _failing_example(stdout: str) -> list[str]:
    """The assertion, falsifying example and likely cause pytest printed for the failing test."""
    lines = _error_lines(stdout)
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("Reproduce: pytest "))]


def test_a_failing_check_prints_the_pytest_line_that_reproduces_it_alone(root_pytester: pytest.Pytester) -> None:
    """The failure ends with its node id, options, world size and seed; that line re-runs it to the same example.

    Both runs in this process: their failure texts are compared, and _pytest_in_process's differ from a subprocess's.
    """
    result = _pytest_in_process(root_pytester, *_CONFORMANCE, *_FAILING)
    stdout = result.stdout.str()
    assert result.ret == 1, stdout + result.stderr.str()
    (line,) = [x for x in _error_lines(stdout) if x.startswith("Reproduce: pytest ")]
    assert line.startswith(
        "Reproduce: pytest 'conformance/test_conformance.py::test_check_holds[gather.forward_matches_cat-w2]' "
        "--conformance-gather tests.forks.broken_gather_drops_own_rows --conformance-max-examples 3 "
        "--dist-world-sizes 2 --hypothesis-seed="
    ), line
    again = _pytest_in_process(root_pytester, *shlex.split(line.removeprefix("Reproduce: "))[1:])
    assert again.ret == 1, again.stdout.str() + again.stderr.str()
    assert "1 failed" in again.stdout.str(), again.stdout.str()
    example = _failing_example(stdout)
    assert "Failing test case: prop(" in example, stdout
    assert _failing_example(again.stdout.str()) == example, again.stdout.str()


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
    args: tuple[str, ...], message: str, root_pytester: pytest.Pytester
) -> None:
    """A required parameter left unfilled, or a bad kwarg or index, stops pytest with a usage error naming it."""
    result = _usage_error(
        root_pytester, "--conformance-gather-fn", "tests.forks.gallery_gather_with_sizes:gather_with_sizes", *args
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


def test_bad_ddp_fn_options_are_pytest_usage_errors_worded_for_pytest(root_pytester: pytest.Pytester) -> None:
    """A --conformance-ddp-fn misuse stops pytest before any world starts, naming the pytest options."""
    result = _usage_error(
        root_pytester, "--conformance-ddp-fn", "tests.forks.gallery_ddp_fairseq:DistributedFairseqModel"
    )
    assert "--conformance-ddp-fn tests.forks.gallery_ddp_fairseq:DistributedFairseqModel has required parameter " \
        "'args' that no option fills; pass it on every call with --conformance-ddp-kwarg args=VALUE" \
        in result.stderr.str()


_SUMMED = ("--conformance-ddp-fn", "tests.forks.gallery_ddp_summed:DataParallel",
           "-k", "wrapper and (trains_like_one_process or ranks_stay_identical)")


@pytest.mark.thorough  # the same wrapper's cause: test_gallery_ddp's "summed" row (in process); options: one table
def test_a_ddp_fn_wrapper_fails_under_pytest_with_its_likely_cause() -> None:
    """A wrapper summing gradients, held to the default mean, fails training under pytest with that cause."""
    from nemo_dist.conformance.suites.wrapper.diagnosis import CAUSES

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
