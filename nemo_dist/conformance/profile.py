"""The hypothesis settings of a conformance run, applied for its duration and then restored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hypothesis_settings"]

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
