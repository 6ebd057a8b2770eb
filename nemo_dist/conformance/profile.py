"""The hypothesis settings and seed of a conformance run, applied for its duration and then restored."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hypothesis_settings", "new_seed", "seeded"]


def new_seed() -> int:
    """A fresh random seed for a run (printed with its failures, so any of them can be re-run alone)."""
    return random.SystemRandom().randrange(2**32)


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Every hypothesis test run in the body draws from ``Random(seed)`` (None: leave hypothesis as it is).

    This is the hook hypothesis's own ``pytest --hypothesis-seed`` sets: a
    check run alone with the same seed draws the same examples, so it finds
    and shrinks to the same failure. ``derandomize`` (torchrun) takes
    precedence over it.
    """
    from hypothesis import core

    previous = core.global_force_seed
    if seed is not None:
        core.global_force_seed = seed  # type: ignore[assignment]
    try:
        yield
    finally:
        core.global_force_seed = previous

_PROFILE = "nemo_dist_conformance"
_RESTORE_PROFILE = "nemo_dist_conformance_restore"


@contextmanager
def hypothesis_settings(
    max_examples: int | None, *, derandomize: bool = False, database: bool = False
) -> Iterator[None]:
    """Run the body under conformance hypothesis settings, then restore the previous ones.

    No example database (unless ``database``: pytest keeps its own), no
    deadline, no ``too_slow`` health check, no ``explain`` phase;
    ``max_examples`` when given (else the active profile's). ``derandomize``
    makes every process draw the same examples (torchrun mode).
    """
    from hypothesis import HealthCheck, Phase, settings

    previous = settings.default
    assert previous is not None
    changes: dict[str, object] = {
        "deadline": None,
        "suppress_health_check": [*previous.suppress_health_check, HealthCheck.too_slow],
    }
    if not database:
        changes["database"] = None
    if max_examples is not None:
        changes["max_examples"] = max_examples
    # "explain" replays examples to list the lines only failing cases ran:
    # noise in a verdict table, extra time, and one more thing that could
    # differ between ranks under torchrun.
    changes["phases"] = [p for p in previous.phases if p is not Phase.explain]
    if derandomize:
        changes["derandomize"] = True
    settings.register_profile(_PROFILE, previous, **changes)
    settings.load_profile(_PROFILE)
    try:
        yield
    finally:
        settings.register_profile(_RESTORE_PROFILE, previous)
        settings.load_profile(_RESTORE_PROFILE)
