"""Conformance suite: does an implementation (the bundled one, a fork, upstream, any all-gather) keep the contract?

``run_conformance(Implementation(gather="my.fork.dist_utils"))`` runs every
registered check of the named components in gloo worlds and returns a
:class:`Report` (verdict per check and world size; checks that need no
process group run once, ddp checks once per entry point);
:func:`format_report` renders it as the command's table,
:func:`write_junit_xml` as JUnit XML and :func:`write_json` as JSON. An ``Implementation`` names modules,
or one all-gather callable (``gather_fn="module:name"``). The core tier is
upstream's contract (nemo-automodel 0.7.0); the extended tier is what
nemo_dist promises beyond it.

The package is laid out in four folders, one per layer, and imports go
downwards only (``docs/ARCHITECTURE.md``; ``tests/test_import_layers.py``
reads the layers from the folders and enforces them):

- :mod:`.engine`: what is checked (:class:`Implementation`, the option table,
  option resolution), the registry of checks, the runner, verdicts and
  reports; it names no suite;
- :mod:`.adapters`: how a suite calls a user's target (a callable's signature
  filled, a ``--ddp-fn`` wrapper, a target that raised on some ranks);
- :mod:`.suites`: one folder per component, each declaring itself in its
  ``options.py`` and registering its checks when imported;
- :mod:`.frontends`: ``nemo-dist-conformance`` (``python -m
  nemo_dist.conformance``), torchrun mode and ``pytest conformance/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below load on first use (:func:`__getattr__`); mypy reads them from here
    from nemo_dist.conformance.engine.declarations import SUITE_PACKAGES
    from nemo_dist.conformance.engine.errors import MissingParameter, NotApplicable, NotSupported, OptionError
    from nemo_dist.conformance.engine.implementation import Implementation
    from nemo_dist.conformance.engine.json_report import write_json
    from nemo_dist.conformance.engine.junit import write_junit_xml
    from nemo_dist.conformance.engine.profile import hypothesis_settings
    from nemo_dist.conformance.engine.registry import CHECKS, TIERS, Case, Check, WorldLike, cases, check, select_checks
    from nemo_dist.conformance.engine.report import format_report
    from nemo_dist.conformance.engine.runner import run_case, run_check, run_checks
    from nemo_dist.conformance.engine.target import (
        COMPONENTS,
        PRESETS,
        REFERENCE,
        checked_components,
        resolve_implementation,
        validate_implementation,
    )
    from nemo_dist.conformance.engine.verdicts import Report, Verdict, is_not_supported

#: Each public name and the module that defines it: imported when first asked for, so that importing the package
#: (or any module of it: the option table, the command's parser) imports no suite, torch or hypothesis.
_EXPORTS = {
    **dict.fromkeys(("MissingParameter", "NotApplicable", "NotSupported", "OptionError"), "engine.errors"),
    "Implementation": "engine.implementation",
    "write_json": "engine.json_report",
    "write_junit_xml": "engine.junit",
    "hypothesis_settings": "engine.profile",
    **dict.fromkeys(("CHECKS", "TIERS", "Case", "Check", "WorldLike", "cases", "check", "select_checks"),
                     "engine.registry"),
    "format_report": "engine.report",
    **dict.fromkeys(("run_case", "run_check", "run_checks"), "engine.runner"),
    "SUITE_PACKAGES": "engine.declarations",
    **dict.fromkeys(("COMPONENTS", "PRESETS", "REFERENCE", "checked_components", "resolve_implementation",
                     "validate_implementation"), "engine.target"),
    **dict.fromkeys(("Report", "Verdict", "is_not_supported"), "engine.verdicts"),
}

__all__ = [
    "CHECKS",
    "COMPONENTS",
    "PRESETS",
    "REFERENCE",
    "SUITE_PACKAGES",
    "TIERS",
    "Case",
    "Check",
    "Implementation",
    "MissingParameter",
    "NotApplicable",
    "NotSupported",
    "OptionError",
    "Report",
    "Verdict",
    "WorldLike",
    "cases",
    "check",
    "checked_components",
    "format_report",
    "hypothesis_settings",
    "is_not_supported",
    "load_checks",
    "resolve_implementation",
    "run_case",
    "run_check",
    "run_checks",
    "run_conformance",
    "select_checks",
    "validate_implementation",
    "write_json",
    "write_junit_xml",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (:data:`_EXPORTS`)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_checks() -> dict[str, Check]:
    """Import the bundled suites (registering their checks); return :data:`CHECKS`, in registration order.

    Idempotent; every front end calls it before it selects checks (the package's import loads nothing)."""
    from nemo_dist.conformance.engine.declarations import SUITE_PACKAGES
    from nemo_dist.conformance.engine.registry import CHECKS

    for name in SUITE_PACKAGES:
        importlib.import_module(name)
    return CHECKS


def run_conformance(
    impl: Implementation | None = None,
    world_sizes: Sequence[int] = (1, 2, 3, 4),
    tier: str = "all",
    max_examples: int | None = 10,
    backend: str = "gloo",
    *,
    select: str | None = None,
    components: Sequence[str] | None = None,
    timeout: float = 120.0,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> Report:
    """Run the registered checks of ``tier`` for the components ``impl`` names (None: the bundled reference).

    One persistent world per size in ``world_sizes`` (gloo by default);
    ``select`` keeps checks whose name contains it; ``components`` limits
    the checks to those components (the other modules still serve them). Returns the
    :class:`Report`; ``report.exit_code(strict)`` is what the command exits with.
    Raises ``MissingParameter`` (a usage error) when the gather callable's first
    call fails for a parameter no ``gather_kwargs`` fills.
    """
    from nemo_dist.conformance.engine.registry import select_checks
    from nemo_dist.conformance.engine.runner import run_checks
    from nemo_dist.conformance.engine.target import REFERENCE

    impl = REFERENCE if impl is None else impl
    checks = select_checks(load_checks().values(), impl, tier, select, components)
    return run_checks(
        checks,
        impl,
        world_sizes,
        backend=backend,
        tier=tier,
        max_examples=max_examples,
        timeout=timeout,
        on_verdict=on_verdict,
        components=components,
    )
