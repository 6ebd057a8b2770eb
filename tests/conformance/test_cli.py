"""Layer 3: the real command as a subprocess (``python -m nemo_dist.conformance``), in gloo worlds of 2 ranks.

The subprocess runs prove the real process's exit statuses: 0 (the
reference passes), 1 (a broken fork) and 2 (a module that does not import).
What the command decides and reports beyond them is checked in this process
through ``main(argv)`` (``run_in_process``): usage errors (no world starts),
and runs whose worlds fork from this process's fork server, where a fresh
interpreter would import torch and the suites again.
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from nemo_dist.conformance.frontends.cli import main
from tests.conformance._cli import (
    REFERENCE_ARGS,
    DirectoryRun,
    failure_section,
    reference_run_group,
    run_command,
    run_in_process,
)

QUICK = ("--world-sizes", "2", "--max-examples", "3", "-q")


@reference_run_group
def test_reference_passes_core_and_prints_the_table(command_from_empty_dir: Callable[..., DirectoryRun]) -> None:
    """Against the bundled modules the core checks pass: exit 0 and a table of PASS rows.

    Two gather checks (``-k matches``): the front end is the subject here; every check against the
    reference is ``test_every_check.py``'s, upstream's whole core tier through this command ``test_upstream.py``'s.
    The run is test_hypothesis_storage's too (it starts in an empty directory).
    """
    result = command_from_empty_dir(*REFERENCE_ARGS).result
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check" in result.stdout
    assert "gather.forward_matches_cat" in result.stdout
    assert "gather.no_grad_matches_cat_without_grad" in result.stdout
    assert " PASS " in result.stdout
    assert " FAIL" not in result.stdout
    assert "CONFORMS (exit 0)" in result.stdout


#: A fork summing the wrong slot, held to its gradient check in worlds of 2 and 3.
_BROKEN_SLOT = (
    "--gather", "tests.forks.broken_gather_reduces_own_slot", "--tier", "core", "-k", "backward_sums",
    "--world-sizes", "2,3", "--max-examples", "3", "-q",
)


def test_broken_fork_exits_one_with_the_shrunk_example_and_junit(tmp_path: Path) -> None:
    """A gather fork summing the wrong slot fails: FAIL rows, the shrunk example, the difference, JUnit failures."""
    junit = tmp_path / "report.xml"
    result = run_command(*_BROKEN_SLOT, "--junit-xml", str(junit))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gather.backward_sums_rank_slices  2      core  FAIL" in result.stdout
    assert "Failing test case" in result.stdout
    assert "values differ\ngot\ntensor([1.])\nexpected\ntensor([0.])" in result.stdout
    assert "DOES NOT CONFORM (exit 1)" in result.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("2", "2")


def test_each_failure_prints_a_line_that_reproduces_it_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The Reproduce line (the check by exact name, its world size, the run's seed) re-runs it: the same failure.

    Both runs in this process: their failure texts are compared, and run_in_process's differ from a subprocess's.
    """
    result = run_in_process(capsys, *_BROKEN_SLOT)
    assert result.returncode == 1, result.stdout + result.stderr
    reproduce = [line for line in result.stdout.splitlines() if line.startswith("Reproduce: ")]
    assert len(reproduce) == 2, result.stdout  # one per failing check run: worlds of 2 and 3
    line = reproduce[1].removeprefix("Reproduce: ")
    prefix = "nemo-dist-conformance --gather tests.forks.broken_gather_reduces_own_slot --tier core --max-examples 3 "
    assert line.startswith(prefix + "--check gather.backward_sums_rank_slices --world-sizes 3 --seed "), line
    again = run_in_process(capsys, *shlex.split(line)[1:], "-q")
    assert again.returncode == 1, again.stdout + again.stderr
    wanted = failure_section(result.stdout)
    wanted = wanted[wanted.index("--- gather.backward_sums_rank_slices (world size 3, core tier) ---") :]
    assert failure_section(again.stdout) == ["Failures", "========", *wanted], again.stdout


def test_missing_extended_keyword_is_not_supported_and_only_strict_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """A fork without uneven= reports NOT SUPPORTED; --strict makes that exit 1 (without it: 0, see test_report)."""
    args = ("--gather", "tests.forks.upstream_style_gather", "--tier", "extended", "-k", "uneven", *QUICK)
    strict = run_in_process(capsys, *args, "--strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "NOT SUPPORTED" in strict.stdout
    assert "takes no uneven= keyword" in strict.stdout
    assert "DOES NOT CONFORM (exit 1)" in strict.stdout


def test_gather_fn_checks_a_bare_callable_and_names_the_likely_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """--gather-fn alone checks a SimCLR-style GatherLayer: its tuple form detected, FAIL, and the likely cause."""
    result = run_in_process(
        capsys, "--gather-fn", "tests.forks.gallery_gather_layer_own_grad:GatherLayer", "--tier", "core",
        "-k", "backward_sums", *QUICK,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "output form 'tuple', detected from its first call" in result.stdout
    assert "gather.backward_sums_rank_slices  2      core  FAIL" in result.stdout
    assert "Likely cause: no cross-rank sum (each rank keeps only its own loss's gradient)" in result.stdout


def test_unimportable_module_is_a_usage_error_naming_it() -> None:
    """A --gather module that does not import exits 2 with the module and the reason on stderr."""
    result = run_command("--gather", "tests.forks.no_such_fork", *QUICK)
    assert result.returncode == 2
    assert "--gather module 'tests.forks.no_such_fork' does not import" in result.stderr
    assert "No module named" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ddp", "nemo_dist.loss.dist_utils"],
         "--ddp module 'nemo_dist.loss.dist_utils' has neither parallelize_ddp nor DDPManager"),
        (["--gather", "nemo_dist.distributed.config"], "has no all_gather_with_grad, all_gather_no_grad"),
        (["--gather-fn", "tests.forks.no_such_fork:gather"], "--gather-fn: module 'tests.forks.no_such_fork' does not"),
        (["--gather-fn", "torch.distributed.nn.functional:no_such"],
         "'torch.distributed.nn.functional' has no 'no_such'"),
        (["--gather-fn", "torch.distributed.nn.functional"], "expected MODULE:NAME"),
        (["--gather", "nemo_dist.loss.dist_utils", "--gather-fn", "torch.distributed.nn.functional:all_gather"],
         "give one of them"),
        (["--no-grad-fn", "torch.distributed.nn.functional:all_gather"], "--no-grad-fn goes with --gather-fn"),
        (["--gather-fn", "torch.distributed.nn.functional:all_gather", "--gather-form", "list"],
         "--gather-form expects one of auto, cat, tuple, stacked"),
        (["--preset", "mine"], "unknown --preset 'mine'; choose one of nemo_dist, nemo_automodel"),
        (["--world-sizes", "2,zero"], "--world-sizes expects an integer >= 1"),
        (["--world-sizes", "0"], "--world-sizes expects an integer >= 1"),
        (["--max-examples", "-1"], "--max-examples expects an integer >= 1"),
        (["--tier", "nightly"], "--tier expects one of core, extended, all"),
        (["--backend", "mpi"], "--backend expects gloo or nccl"),
        (["--timeout", "0"], "--timeout expects a number of seconds > 0"),
        (["--min-deadline", "soon"], "--min-deadline expects a number of seconds > 0, such as --min-deadline 30"),
        (["--seed", "-3"], "--seed expects an integer >= 0, such as --seed 1234; got '-3'"),
        (["--check", "gather.no_such_check"], "--check 'gather.no_such_check' names no check of the selected tier"),
        (["--check", "ddp.bucket_cap_mb[Nope]"],
         "no entry point 'Nope' for this check; use ddp.bucket_cap_mb[parallelize_ddp], ddp.bucket_cap_mb[DDPManager]"),
        (["--hypothesis-db", ""], "--hypothesis-db expects a directory or 'none'; got an empty value"),
        (["--hypothesis-db", __file__], "exists and is not a directory; give a directory or 'none'"),
        (["--hypothesis-db", f"{__file__}/db"], "cannot be used (Not a directory); give a writable directory"),
        (["--moe-fn", "nemo_dist.distributed.expert_parallel:parallelize_experts", "--moe-compute-dtype", "fp32"],
         "--moe-compute-dtype expects one of float64, float32, bfloat16, float16; got 'fp32'"),
        (["--moe-fn", "tests.forks.no_such_fork:apply_ep"], "--moe-fn: module 'tests.forks.no_such_fork' does not"),
        (["--a2a-kwarg", "group=@group"], "--a2a-kwarg applies to a --a2a-fn callable only"),
        (["--moe-fn", "nemo_dist.distributed.expert_parallel:parallelize_experts", "--moe-reduction", "mean"],
         "--moe-reduction applies under --moe-mesh edp,ep or edp,ep,tp, where the target makes its own reductions"),
        (["--moe-fn", "tests.forks.gallery_moe_composed:apply_ep", "--moe-mesh", "edp,ep", "--moe-loss-scale", "dp"],
         "--moe-loss-scale expects a number or one of @world, @dp, @edp, @ep, @tp; got 'dp'"),
        (["--moe-fn", "tests.forks.gallery_moe_composed:apply_ep", "--moe-mesh", "edp,dp"],
         "--moe-mesh expects one of ep, edp,ep, edp,ep,tp"),
        (["--moe-fn", "nemo_dist.distributed.expert_parallel:parallelize_experts", "--moe-aux-reduction", "mean"],
         "--moe-aux-reduction applies under --moe-mesh edp,ep or edp,ep,tp"),
        (["--moe-fn", "tests.forks.gallery_moe_composed:apply_ep", "--moe-mesh", "edp,ep", "--moe-aux-reduction",
          "avg"], "--moe-aux-reduction expects one of sum, mean"),
        (["--pp-fn", "tests.forks.no_such_fork:pipeline"], "--pp-fn: module 'tests.forks.no_such_fork' does not"),
        (["--pp-fn", "tests.forks.gallery_pp_torchtitan:pipeline", "--pp-schedule", "1F1B,PipeDream"],
         "--pp-schedule: unknown schedule 'PipeDream'; expected some of GPipe,1F1B,Interleaved1F1B"),
        (["--pp-fn", "tests.forks.gallery_pp_torchtitan:pipeline", "--pp-loss", "sum"],
         "--pp-loss expects one of mean, token_sum; got 'sum'"),
        (["--pp-fn", "tests.forks.gallery_pp_torchtitan:pipeline", "--pp-compute-dtype", "bfloat16"],
         "--pp-compute-dtype expects one of float64, float32; got 'bfloat16'"),
        (["--pp-fn", "tests.forks.gallery_pp_torchtitan:pipeline", "--pp-model", "tests.forks.no_such_fork:m"],
         "--pp-model: module 'tests.forks.no_such_fork' does not"),
        (["--pp-fn", "tests.forks.gallery_pp_torchtitan:pipeline", "--pp-step", "tests.forks.gallery_pp_steps:nope"],
         "--pp-step: 'tests.forks.gallery_pp_steps' has no 'nope'"),
    ],
    ids=["ddp-lacks-entry-points", "gather-lacks-functions", "gather-fn-unimportable", "gather-fn-missing-name",
         "gather-fn-no-colon", "gather-and-gather-fn", "no-grad-fn-alone", "gather-form", "unknown-preset",
         "world-size-not-int", "world-size-zero", "max-examples", "tier", "backend", "timeout", "min-deadline", "seed",
         "check-unknown", "check-entry-point", "hypothesis-db-empty", "hypothesis-db-a-file",
         "hypothesis-db-under-a-file", "moe-compute-dtype", "moe-fn-unimportable", "a2a-kwarg-alone",
         "moe-reduction-without-composition", "moe-loss-scale", "moe-mesh", "moe-aux-reduction-without-composition",
         "moe-aux-reduction", "pp-fn-unimportable", "pp-schedule", "pp-loss", "pp-compute-dtype",
         "pp-model-unimportable", "pp-step-missing"],
)
def test_usage_errors_exit_two_saying_what_and_how(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad command line exits 2 before any world starts, with a message naming the problem."""
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_nccl_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--backend nccl on a machine without CUDA exits 2 and suggests gloo."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here, so nccl is a valid backend")
    assert main(["--backend", "nccl"]) == 2
    assert "use --backend gloo" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sizes", "gpus", "fit", "left_out"),
    [
        ((1, 2, 3, 4), 1, (1,), (2, 3, 4)),
        ((1, 2, 3, 4), 8, (1, 2, 3, 4), ()),
        ((2, 4), 2, (2,), (4,)),
        ((2, 3), 1, (), (2, 3)),
    ],
    ids=["one_gpu_default_sizes", "eight_gpus", "two_gpus", "none_fits"],
)
def test_nccl_runs_only_the_world_sizes_the_visible_gpus_allow(
    sizes: tuple[int, ...], gpus: int, fit: tuple[int, ...], left_out: tuple[int, ...]
) -> None:
    """One GPU per rank: sizes above the visible count are left out, each named once with its reason."""
    from nemo_dist.conformance.frontends.cli import fitting_world_sizes

    got, notes = fitting_world_sizes(sizes, gpus)
    assert got == fit
    assert notes == tuple(
        f"world size {s} not run: an NCCL world of {s} needs {s} GPUs, {gpus} visible" for s in left_out
    )


@pytest.mark.parametrize(
    ("gpus", "args", "message"),
    [
        ("1", ("--world-sizes", "2,3"), "--world-sizes 2,3: none fits the 1 visible GPU(s)"),
        ("0", (), "--backend nccl needs CUDA"),
    ],
    ids=["no_size_fits", "no_cuda"],
)
def test_nccl_without_a_fitting_size_is_a_usage_error(
    gpus: str, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On nccl, asking only for sizes the GPUs cannot hold (or having no CUDA) exits 2 naming why, starting nothing."""
    monkeypatch.setenv("NEMO_DIST_FAKE_GPU_COUNT", gpus)
    result = run_in_process(capsys, "--backend", "nccl", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert result.stdout == ""
