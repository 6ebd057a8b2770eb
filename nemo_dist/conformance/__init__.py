"""Conformance suite: does an implementation (the bundled one, a fork, upstream, any all-gather) keep the contract?

``run_conformance(Implementation(gather="my.fork.dist_utils"))`` runs every
registered check of the named components in gloo worlds and returns a
:class:`Report` (verdict per check and world size; checks that need no
process group run once, ddp checks once per entry point). An
``Implementation`` names modules, or one all-gather callable
(``gather_fn="module:name"``). The core tier is upstream's contract
(nemo-automodel 0.7.0); the extended tier is what nemo_dist promises beyond
it. The command ``nemo-dist-conformance`` (``python -m nemo_dist.conformance``)
wraps it, and also runs inside a torchrun world. The checks live in
``gather_checks``, ``ddp_checks``, ``model_checks`` and ``config_checks`` and
register themselves in :data:`CHECKS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from nemo_dist.conformance._impl import (
    PRESETS,
    REFERENCE,
    Implementation,
    NotApplicable,
    NotSupported,
    OptionError,
    resolve_implementation,
    validate_implementation,
)
from nemo_dist.conformance._registry import CHECKS, Check, WorldLike, check
from nemo_dist.conformance._runner import (
    TIERS,
    Report,
    Verdict,
    checked_components,
    hypothesis_settings,
    is_not_supported,
    run_check,
    run_checks,
    select_checks,
)

__all__ = [
    "CHECKS",
    "CHECK_MODULES",
    "PRESETS",
    "REFERENCE",
    "TIERS",
    "Check",
    "Implementation",
    "NotApplicable",
    "NotSupported",
    "OptionError",
    "Report",
    "Verdict",
    "WorldLike",
    "check",
    "checked_components",
    "hypothesis_settings",
    "is_not_supported",
    "load_checks",
    "resolve_implementation",
    "run_check",
    "run_checks",
    "run_conformance",
    "select_checks",
    "validate_implementation",
]

#: The modules whose import registers the bundled checks.
CHECK_MODULES: tuple[str, ...] = (
    "nemo_dist.conformance.gather_checks",
    "nemo_dist.conformance.ddp_checks",
    "nemo_dist.conformance.config_checks",
    "nemo_dist.conformance.model_checks",
)


def load_checks() -> dict[str, Check]:
    """Import the bundled check modules (registering their checks); return :data:`CHECKS`.

    A check module that does not exist yet is skipped; any other import error
    (including a missing module *inside* a check module) propagates.
    """
    for name in CHECK_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return CHECKS


def run_conformance(
    impl: Implementation = REFERENCE,
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
    """Run the registered checks of ``tier`` for the components ``impl`` names.

    One persistent world per size in ``world_sizes`` (gloo by default);
    ``select`` keeps checks whose name contains it; ``components`` limits
    the checks to those components (the other modules still serve them). Returns the
    :class:`Report`; ``report.exit_code(strict)`` is what the command exits with.
    """
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


load_checks()
