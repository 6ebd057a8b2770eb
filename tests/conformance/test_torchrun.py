"""Layer 3: the command inside a torchrun world (``torchrun --standalone --nproc-per-node 3``, gloo).

Every rank checks; rank 0 alone prints the table; every rank exits with the
same status.
"""

from __future__ import annotations

from tests.conformance._cli import run_torchrun


def test_reference_passes_in_a_torchrun_world_and_rank_zero_prints_once() -> None:
    """Against the bundled modules the core tier passes in 3 torchrun ranks and the table appears once."""
    # The real-transformers checks run in spawned worlds elsewhere; here the torchrun plumbing is the subject.
    result = run_torchrun(3, "--max-examples", "3", "--tier", "core", "-k", "not real_models", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("nemo_dist conformance:") == 1
    assert "torchrun world of 3 ranks" in result.stdout
    assert "gather.forward_matches_cat                               3" in result.stdout
    assert "CONFORMS (exit 0)" in result.stdout


def test_broken_fork_fails_in_a_torchrun_world() -> None:
    """A broken gather fork exits 1 under torchrun with the FAIL row and example; --world-sizes is noted as ignored."""
    result = run_torchrun(
        3, "--gather", "tests.forks.broken_gather_forward_drops_last_rank", "--max-examples", "3",
        "--tier", "core", "-k", "forward_matches_cat", "-q", "--world-sizes", "2",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--world-sizes is ignored under torchrun" in result.stdout
    assert result.stdout.count("nemo_dist conformance:") == 1
    assert " FAIL " in result.stdout
    assert "Failing test case" in result.stdout
