"""Layer 3 (a fresh interpreter): nothing is imported before it is needed.

Importing :mod:`nemo_dist.conformance` loads no suite (the registry fills on
the first :func:`~nemo_dist.conformance.load_checks`), so the command's
``--help`` and a usage error import no suite, no hypothesis and no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

from nemo_dist.conformance.engine.declarations import SUITE_PACKAGES

_PROBE = """
import json, sys
from nemo_dist.conformance.frontends.cli import main
codes = []
for argv in (["--help"], ["--tier", "bogus"], ["--world-sizes", "0"]):
    try:
        codes.append(main(argv))
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def test_help_and_usage_errors_import_no_suite_no_hypothesis_no_torch() -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["codes"] == [0, 2, 2]
    loaded = set(found["modules"])
    assert loaded & set(SUITE_PACKAGES) == set()
    assert "hypothesis" not in loaded
    assert "torch" not in loaded


def test_the_registry_fills_on_first_use() -> None:
    """A fresh import of the package registers no check until :func:`load_checks` is called; then every suite's."""
    probe = ("import nemo_dist.conformance as c, nemo_dist.conformance.engine.registry as r; before = len(r.CHECKS); "
             "c.load_checks(); print(before, len({k.split('.')[0] for k in r.CHECKS}))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", str(len(SUITE_PACKAGES) - 1)]  # real_models registers ddp checks
