"""Layer 2: gloo worlds of 2 ranks. Every broken fork in ``tests/forks`` is caught; the correct ones pass.

Each fork is checked for the component it provides (the bundled modules serve
the others), through the same selection, runner and table as the command.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from nemo_dist.conformance import REFERENCE, Implementation, Report, load_checks, run_checks, select_checks
from nemo_dist.conformance._report import format_report
from nemo_dist.testing.plugin import WorldFactory

# The gallery forks are bare callables, checked with --gather-fn in test_gallery.py.
FORKS = sorted(
    p.stem
    for p in (Path(__file__).parents[1] / "forks").glob("*.py")
    if p.stem != "__init__" and not p.stem.startswith("gallery_")
)
BROKEN = [f for f in FORKS if f.startswith("broken_")]
#: Broken forks whose failures name a likely cause (world of 2), and the cause's first words.
LIKELY_CAUSES = {
    "broken_gather_forward_drops_last_rank": "rank 1's rows missing from the output",
    "broken_gather_wrong_order": "rank order reversed",
    "broken_gather_no_cross_rank_sum": "no cross-rank sum",
    "broken_gather_gathers_in_float32": "dtype changed",
}
CORRECT = [f for f in FORKS if not f.startswith("broken_")]


def _component(module: str) -> str:
    fork = importlib.import_module(module)
    for component, name in (("gather", "all_gather_with_grad"), ("ddp", "DDPManager"), ("config", "DDPConfig")):
        if hasattr(fork, name):
            return component
    raise AssertionError(f"{module} provides none of all_gather_with_grad, DDPManager, DDPConfig")


def _run(fork: str, world_factory: WorldFactory) -> tuple[Report, str]:
    module = f"tests.forks.{fork}"
    component = _component(module)
    impl = Implementation(**{**{c: getattr(REFERENCE, c) for c in ("gather", "ddp", "config")}, component: module})
    # The real-transformers checkpointing checks have their own tests (tests/ddp, test_upstream.py).
    selected = select_checks(load_checks().values(), impl, "all", None, (component,))
    checks = [c for c in selected if "real_models" not in c.name]
    report = run_checks(
        checks, impl, (2,), max_examples=5, worlds=world_factory,
        components=(component,),
    )
    return report, format_report(report)


@pytest.mark.parametrize("fork", BROKEN)
def test_broken_fork_is_caught_with_a_readable_failure(fork: str, world_factory: WorldFactory) -> None:
    """A broken fork gets FAIL rows, each with a message (and a likely cause where one fits), and a failing exit."""
    report, table = _run(fork, world_factory)
    failures = [v for v in report.verdicts if v.failed]
    assert failures, table
    assert " FAIL" in table
    assert all(v.message for v in failures), table
    if fork in LIKELY_CAUSES:
        assert any(v.cause.startswith(LIKELY_CAUSES[fork]) for v in failures), table
    if any(v.tier == "core" for v in failures):
        assert report.exit_code() == 1, table
    else:  # an extended-tier bug blocks only a strict run
        assert (report.exit_code(), report.exit_code(strict=True)) == (0, 1), table


@pytest.mark.parametrize("fork", CORRECT)
def test_correct_fork_conforms(fork: str, world_factory: WorldFactory) -> None:
    """A correct fork exits 0; one written to the whole SPEC (``independent_*``) passes --strict too."""
    report, table = _run(fork, world_factory)
    assert report.exit_code() == 0, table
    if fork.startswith("independent_"):
        assert report.exit_code(strict=True) == 0, table
