"""Hypothesis settings profiles of the nemo_dist suite.

``ci`` (the default under pytest): 25 examples, for the merge gate.
``dev``: 50 examples, for local work. ``thorough``: 500 examples, for nightly
runs. All have no per-example deadline (an example runs collectives in other
processes) and do not fail on the ``too_slow`` health check. Choose one with
hypothesis's ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PROFILE", "PROFILES", "register_profiles"]

DEFAULT_PROFILE = "ci"

#: Profile name -> max_examples.
PROFILES: dict[str, int] = {"ci": 25, "dev": 50, "thorough": 500}


def register_profiles() -> None:
    """Register the ``ci``, ``dev`` and ``thorough`` profiles with hypothesis.

    Idempotent; loads nothing (the pytest plugin chooses the active profile).
    """
    from hypothesis import HealthCheck, settings

    for name, max_examples in PROFILES.items():
        settings.register_profile(
            name,
            max_examples=max_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
