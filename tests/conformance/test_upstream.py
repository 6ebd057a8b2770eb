"""Layer 3: the command against upstream itself, on the core tier.

The core tier is upstream's contract, so the released package (nemo-automodel
0.7.0, installed with ``pip install --no-deps``) must conform on it; what
nemo_dist promises beyond upstream shows as extended findings, never as core
failures. The upstream-faithful fork, which must do the same without upstream
installed, is judged in ``test_forks.py``.
"""

from __future__ import annotations

import pytest

from tests import targets
from tests.conformance._cli import run_command


@pytest.mark.upstream
def test_released_upstream_conforms_on_the_core_tier() -> None:
    """`nemo-dist-conformance --preset nemo_automodel --tier core` (world sizes 1, 2) exits 0 with no failure.

    Skipped where upstream's modules do not import (``pip install --no-deps nemo-automodel==0.7.0``
    and transformers), failed there under ``--require-targets``.
    """
    for module in targets.UPSTREAM_MODULES:
        targets.import_target(module)
    result = run_command(
        "--preset", "nemo_automodel", "--tier", "core", "--world-sizes", "1,2", "--max-examples", "5", "-q",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CONFORMS (exit 0)" in result.stdout
    assert " FAIL" not in result.stdout, result.stdout
    assert " HANG" not in result.stdout, result.stdout
    assert "NOT APPLICABLE" in result.stdout  # the bucket checks at world size 1, where no DDP object exists
