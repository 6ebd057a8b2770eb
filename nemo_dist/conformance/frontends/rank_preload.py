"""What the command's fork server imports before any rank: the suites, and the modules their checks preload.

``nemo_dist.command`` starts the fork server with this module to preload,
so that its imports (the suites' rank sides, ``transformers`` and the modeling
modules the real-model checks build) overlap with the command's own start.
Every later rank inherits them. Importing it in any other process only
imports the suites and those modules; a module that fails to import is
left out, for the rank that needs it to meet the error itself.
"""

from __future__ import annotations

import contextlib
import importlib

from nemo_dist.conformance import CHECKS, load_checks

__all__ = ["PRELOADED"]


def _preload() -> tuple[str, ...]:
    """Import every module a registered check names in ``preload``; the names imported."""
    load_checks()
    imported = []
    for name in dict.fromkeys(m for c in CHECKS.values() for m in c.preload):
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            imported.append(name)
    return tuple(imported)


#: The modules this import brought in for the checks (beyond the suites themselves).
PRELOADED = _preload()
