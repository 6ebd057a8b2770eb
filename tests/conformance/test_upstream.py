"""Layer 3: upstream itself against the core tier, and a fork written to behave as upstream does.

The core tier is upstream's contract, so the released package (nemo-automodel
0.7.0, installed with ``pip install --no-deps``) must conform on it; what
nemo_dist promises beyond upstream shows as extended findings, never as core
failures. The upstream-faithful fork (``tests/forks/upstream_faithful_*``,
written from upstream's documented behaviour, no copied code) must do the
same without upstream installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from nemo_dist.conformance import Implementation, load_checks, run_checks, select_checks
from nemo_dist.conformance._report import format_report
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance._cli import run_command

UPSTREAM_MISSING = importlib.util.find_spec("nemo_automodel") is None
TRANSFORMERS_MISSING = importlib.util.find_spec("transformers") is None

FAITHFUL = Implementation(
    gather="tests.forks.upstream_faithful_dist_utils",
    ddp="tests.forks.upstream_faithful_ddp",
    config="tests.forks.upstream_faithful_config",
)

#: What upstream does not promise, as (check, world size) failures of the extended tier in a world of 1
#: (where upstream differs most; the larger worlds are the upstream test's and test_forks.py's).
EXTENDED_FINDINGS = {
    ("gather.uninitialised_no_grad_never_requires_grad", 0),  # all_gather_no_grad returns x itself
    ("config.rejects_bad_values_naming_field", 0),  # a plain dataclass: only the scope is validated
    ("gather.no_grad_never_requires_grad", 1),  # x itself in a world of one
    ("gather.zero_dim_raises_on_every_rank", 1),
    ("ddp.world_of_one_wrapped_in_ddp[parallelize_ddp]", 1),  # the model comes back unwrapped
    ("ddp.world_of_one_wrapped_in_ddp[DDPManager]", 1),
    ("ddp.autocast_dtype[parallelize_ddp]", 1),  # the field exists; nothing applies it
    ("ddp.autocast_dtype[DDPManager]", 1),
}
if not TRANSFORMERS_MISSING:  # Whisper's encoder is the audio group only beyond upstream
    EXTENDED_FINDINGS |= {
        (f"ddp.checkpointing_real_models_beyond_upstream[{api}]", 1) for api in ("parallelize_ddp", "DDPManager")
    }


def test_upstream_faithful_fork_conforms_and_reports_upstreams_extended_findings(
    world_factory: WorldFactory,
) -> None:
    """The fork passes every core check in a world of 1; its failures are exactly upstream's extended findings."""
    checks = select_checks(load_checks().values(), FAITHFUL, "all")
    report = run_checks(checks, FAITHFUL, (1,), max_examples=3, worlds=world_factory)
    table = format_report(report)
    assert report.exit_code() == 0, table
    assert {(v.check, v.world_size) for v in report.verdicts if v.failed} == EXTENDED_FINDINGS, table
    assert all(v.tier == "extended" and v.message for v in report.verdicts if v.failed), table
    not_applicable = {v.check.split("[")[0] for v in report.verdicts if v.outcome == "not applicable"}
    assert {"ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view", "ddp.static_graph"} <= not_applicable, table
    assert "DeprecationWarning: DDPManager is deprecated" in table


@pytest.mark.upstream
@pytest.mark.skipif(UPSTREAM_MISSING, reason="nemo_automodel is not installed (pip install --no-deps nemo-automodel)")
def test_released_upstream_conforms_on_the_core_tier() -> None:
    """`nemo-dist-conformance --preset nemo_automodel --tier core` (world sizes 1, 2) exits 0 with no failure."""
    result = run_command(
        "--preset", "nemo_automodel", "--tier", "core", "--world-sizes", "1,2", "--max-examples", "5", "-q",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CONFORMS (exit 0)" in result.stdout
    assert " FAIL" not in result.stdout, result.stdout
    assert " HANG" not in result.stdout, result.stdout
    assert "NOT APPLICABLE" in result.stdout  # the bucket checks at world size 1, where no DDP object exists
