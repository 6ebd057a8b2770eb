"""The versions a run's verdicts depend on: nemo_dist, torch, Python, and the test targets a run uses.

Verdicts change with the torch release (a collective's behaviour, FSDP2's
arithmetic), so every report says which one gave them: the text header, the
JUnit file's properties and the JSON report all read :func:`run_versions`.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys

__all__ = ["package_version", "run_versions"]

#: Test targets a run may use, by import name -> distribution name (never imported by this package).
_TARGETS = {"transformers": "transformers", "nemo_automodel": "nemo-automodel"}


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``"nemo-dist"``), or None where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_versions(named: str = "") -> dict[str, str]:
    """``nemo_dist``, ``torch`` and ``python`` versions, then each test target a run uses: imported in this process
    or named in ``named`` (the run's option values as text). torch's is its ``__version__`` where it is imported
    (it names the build, ``+cpu``), else its distribution's."""
    torch = sys.modules.get("torch")
    found = {
        "nemo_dist": package_version("nemo-dist") or "unknown",
        "torch": str(getattr(torch, "__version__", "")) or package_version("torch") or "not installed",
        "python": platform.python_version(),
    }
    for module, distribution in _TARGETS.items():
        if module in sys.modules or module in named:
            found[distribution] = package_version(distribution) or "not installed"
    return found
