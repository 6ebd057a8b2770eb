"""Layer 0: no process group. The DDPConfig conformance checks, and the entry points outside a world.

These checks need no process group: they run in the test process with no world.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, config_checks, ddp_checks


def test_defaults_match_spec_table() -> None:
    """DDPConfig() has the SPEC's default for every field."""
    config_checks.defaults_match_spec(None, REFERENCE)


def test_bad_values_fail_at_construction_naming_the_field() -> None:
    """Negative bucket, str for bool, unknown or mixed scope raise TypeError/ValueError naming the field."""
    config_checks.rejects_bad_values_naming_field(None, REFERENCE)


def test_unknown_and_mixed_scopes_fail_naming_the_field() -> None:
    """Unknown scope names and "all" mixed with others raise naming the field (the core part of validation)."""
    config_checks.scope_names_validated(None, REFERENCE)


def test_scope_is_normalised_to_a_tuple_of_groups() -> None:
    """Scopes given with ',' or '+' or as a list become a tuple of group names."""
    config_checks.scope_normalised_to_tuple(None, REFERENCE)


@pytest.mark.parametrize("api", ["parallelize_ddp", "DDPManager"])
def test_entry_points_without_process_group_raise_runtime_error(api: str) -> None:
    """parallelize_ddp(model, DDPConfig()) and DDPManager(DDPConfig()) raise RuntimeError with no process group."""
    ddp_checks.requires_process_group(None, REFERENCE.with_ddp_api(api))
