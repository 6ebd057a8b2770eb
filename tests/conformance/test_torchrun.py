"""Layer 3: the command inside a torchrun world (``torchrun --standalone --nproc-per-node 2`` or ``3``, gloo).

Every rank checks; rank 0 alone prints the table; every rank exits with the
same status.
"""

from __future__ import annotations

import re
import shlex

import pytest

from nemo_dist.conformance.frontends import arguments, cli
from tests.conformance._cli import failure_section, run_torchrun, shared_torchrun


@pytest.mark.thorough  # the failing run below also prints once, from rank 0 of a torchrun world of 2
def test_reference_passes_in_a_torchrun_world_and_rank_zero_prints_once() -> None:
    """Against the bundled modules two core checks pass in 3 torchrun ranks and the table appears once."""
    # The torchrun plumbing is the subject: two gather checks (-k matches), not the tier.
    result = run_torchrun(3, "--max-examples", "3", "--tier", "core", "-k", "matches", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("nemo_dist conformance:") == 1
    assert "torchrun world of 3 ranks" in result.stdout
    assert re.search(r"^gather\.forward_matches_cat +3 +core +PASS", result.stdout, re.M), result.stdout
    assert "CONFORMS (exit 0)" in result.stdout


#: One failing torchrun run, read by the two tests after it (kept in one xdist worker, so it runs once).
_failing_group = pytest.mark.xdist_group(name="torchrun_failing_run")
_FAILING = (
    "--gather", "tests.forks.broken_gather_forward_drops_last_rank", "--max-examples", "3",
    "--tier", "core", "-k", "forward_matches_cat", "-q", "--world-sizes", "3",
)


@_failing_group
def test_broken_fork_fails_in_a_torchrun_world() -> None:
    """A broken gather fork exits 1 under torchrun with the FAIL row (in the torchrun world of 2, not the 3 that
    --world-sizes names: it is noted as ignored) and the example."""
    result = shared_torchrun(2, *_FAILING)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--world-sizes is ignored under torchrun" in result.stdout
    assert result.stdout.count("nemo_dist conformance:") == 1
    assert re.search(r"^gather\.forward_matches_cat +2 +core +FAIL", result.stdout, re.M), result.stdout
    assert "Failing test case" in result.stdout


@_failing_group
def test_a_failure_under_torchrun_prints_the_torchrun_line_that_reproduces_it() -> None:
    """The Reproduce line is torchrun's launch of this world with the check alone: re-run, the same failure."""
    result = shared_torchrun(2, *_FAILING)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [x.removeprefix("Reproduce: ") for x in result.stdout.splitlines() if x.startswith("Reproduce: ")]
    assert line == (
        "torchrun --standalone --nproc-per-node 2 -m nemo_dist.conformance "
        "--gather tests.forks.broken_gather_forward_drops_last_rank --tier core --max-examples 3 "
        "--check gather.forward_matches_cat"
    ), result.stdout
    words = shlex.split(line)
    launch, command = words[:6], words[6:]
    assert launch == ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "nemo_dist.conformance"]
    again = run_torchrun(2, *command, "-q")
    assert again.returncode == 1, again.stdout + again.stderr
    assert failure_section(again.stdout) == failure_section(result.stdout), again.stdout


@pytest.mark.parametrize(
    ("world", "local", "launch"),
    [("4", "4", "torchrun --standalone --nproc-per-node 4"), ("8", "4", "torchrun --nnodes 2 --nproc-per-node 4")],
    ids=["one-node", "two-nodes"],
)
def test_the_torchrun_reproduce_prefix_names_the_launch_of_this_world(
    world: str, local: str, launch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node: --standalone with the ranks per node; several: --nnodes too (their rendezvous is the user's)."""
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    args = arguments.parser().parse_args(["--tier", "core", "--max-examples", "3"])
    assert cli._torchrun_command(args) == f"{launch} -m nemo_dist.conformance --tier core --max-examples 3"


@pytest.mark.thorough  # torchrun's front end: the failing run above; the wrapper's cause: test_gallery_ddp
def test_a_ddp_fn_wrapper_is_checked_in_a_torchrun_world_with_its_likely_cause() -> None:
    """--ddp-fn under torchrun: a summing wrapper (mean declared) fails its training check, naming the cause."""
    result = run_torchrun(
        2, "--ddp-fn", "tests.forks.gallery_ddp_summed:DataParallel", "--max-examples", "3",
        "-k", "wrapper.trains_like_one_process", "-q",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("nemo_dist conformance:") == 1
    assert re.search(r"^wrapper\.trains_like_one_process +2 +core +FAIL", result.stdout, re.M), result.stdout
    assert "Likely cause: sum where mean was declared" in result.stdout
    assert "--ddp-fn tests.forks.gallery_ddp_summed:DataParallel --max-examples 3 --check " \
        "wrapper.trains_like_one_process" in result.stdout
