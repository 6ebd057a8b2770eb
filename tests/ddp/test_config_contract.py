"""Layer 0: no process group. The DDPConfig conformance checks, run against the reference.

These checks build configs in the test process; the world argument is unused.
"""

from __future__ import annotations

from nemo_dist.conformance import REFERENCE, config_checks


def test_defaults_match_spec_table() -> None:
    """DDPConfig() has the SPEC's default for every field."""
    config_checks.defaults_match_spec(None, REFERENCE)  # type: ignore[arg-type]


def test_bad_values_fail_at_construction_naming_the_field() -> None:
    """Negative bucket, str for bool, unknown or mixed scope raise TypeError/ValueError naming the field."""
    config_checks.rejects_bad_values_naming_field(None, REFERENCE)  # type: ignore[arg-type]


def test_scope_is_normalised_to_a_tuple_of_groups() -> None:
    """Scopes given with ',' or '+' or as a list become a tuple of group names."""
    config_checks.scope_normalised_to_tuple(None, REFERENCE)  # type: ignore[arg-type]


def test_manager_without_process_group_raises_runtime_error() -> None:
    """DDPManager(DDPConfig()) raises RuntimeError when no process group is initialised."""
    config_checks.manager_requires_process_group(None, REFERENCE)  # type: ignore[arg-type]
