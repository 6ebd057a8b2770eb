"""Layer 3: the command against upstream itself, on the core tier.

The command runs in this process (``run_in_process``): its verdicts are the subject here, its process is
test_cli's.

The core tier is upstream's contract, so the released package (nemo-automodel
0.7.0, installed with ``pip install --no-deps``) must conform on it; what
nemo_dist promises beyond upstream shows as extended findings, never as core
failures. The upstream-faithful fork, which must do the same without upstream
installed, is judged in ``test_forks.py``.
"""

from __future__ import annotations

import re

import pytest

from nemo_dist.conformance import CHECKS, load_checks
from tests import targets
from tests.conformance._cli import run_in_process

load_checks()
#: Every core FSDP2 check: each runs with no process group or in a world of 1 or 2 ranks, so each must pass there.
FSDP2_CHECKS = {name for name, check in CHECKS.items() if check.component == "fsdp2" and check.tier == "core"}
#: Every core tp check that runs in a world of 2 (the 2-D one needs 4).
TP_CHECKS = {
    name for name, check in CHECKS.items()
    if check.component == "tp" and check.tier == "core" and check.applies_to(2)
}
#: The check of fsdp2_strategy_parallelize's defaults, which upstream's fsdp2 module does not define.
FUNCTIONAL = "fsdp2.functional_entry_point_keeps_upstream_defaults"


@pytest.mark.upstream
def test_released_upstream_conforms_on_the_core_tier(capsys: pytest.CaptureFixture[str]) -> None:
    """`nemo-dist-conformance --preset nemo_automodel --tier core` (world sizes 1, 2) exits 0 with no failure,
    every FSDP2 check passing.

    Skipped where upstream's modules do not import (``pip install --no-deps nemo-automodel==0.7.0``
    and transformers), failed there under ``--require-targets``.
    """
    for module in targets.UPSTREAM_MODULES:
        targets.import_target(module)
    result = run_in_process(
        capsys, "--preset", "nemo_automodel", "--tier", "core", "--world-sizes", "1,2", "--max-examples", "5", "-q",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CONFORMS (exit 0)" in result.stdout
    assert " FAIL" not in result.stdout, result.stdout
    assert " HANG" not in result.stdout, result.stdout
    assert "NOT APPLICABLE" in result.stdout  # the bucket checks at world size 1, where no DDP object exists
    # Upstream's FSDP2 path is checked too, get_sync_ctx included (the preset names upstream's utils module).
    assert "fsdp2=nemo_automodel.components.distributed.fsdp2" in result.stdout, result.stdout
    passed = set(re.findall(r"^(fsdp2\.\w+)\s+[\d-]\s+core\s+PASS", result.stdout, re.MULTILINE))
    # Upstream keeps its functional entry point in components.distributed.parallelizer, not in the fsdp2 module.
    assert passed == FSDP2_CHECKS - {FUNCTIONAL}, result.stdout
    unsupported = rf"^{re.escape(FUNCTIONAL)}\s+2\s+core\s+NOT SUPPORTED"
    assert re.search(unsupported, result.stdout, re.MULTILINE), result.stdout
    # Upstream's tensor-parallel plans too, through its parallelizer, its replica sync declared by the preset.
    assert "tp=nemo_automodel.components.distributed.parallelizer" in result.stdout, result.stdout
    tp_passed = set(re.findall(r"^(tp\.\w+)\s+2\s+core\s+PASS", result.stdout, re.MULTILINE))
    assert tp_passed == TP_CHECKS, result.stdout


@pytest.mark.upstream
@pytest.mark.parametrize(
    ("options", "verdict"),
    [
        pytest.param(("--tp", "nemo_automodel.components.distributed.parallelizer"), "FAIL", id="without-sync"),
        pytest.param(("--preset", "nemo_automodel"), "PASS", id="preset-declares-sync"),
    ],
)
def test_upstream_qwen3_q_norm_gradients_need_its_replica_sync(
    options: tuple[str, ...], verdict: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upstream's parallelizer on Qwen3 leaves the per-head norms' gradients partial per rank until its training
    recipe's ``synchronize_tp_replica_gradients``: without that step declared the gradient check fails naming a
    missing replica sync; the preset declares it and the check passes."""
    for module in (*targets.UPSTREAM_MODULES, "transformers"):
        targets.import_target(module)
    result = run_in_process(
        capsys, *options, "--tp-model", "tests.forks.gallery_tp_hf_plan:qwen3", "--check",
        "tp.gradients_equal_unsharded", "--world-sizes", "2", "-q",
    )
    assert re.search(rf"^tp\.gradients_equal_unsharded\s+2\s+core\s+{verdict}", result.stdout, re.MULTILINE), (
        result.stdout + result.stderr
    )
    if verdict == "FAIL":
        assert "q_norm.weight" in result.stdout, result.stdout
        assert "a missing replica sync" in result.stdout, result.stdout
