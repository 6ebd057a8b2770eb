"""Every registered conformance check as a pytest test, against the modules the options name.

Layer 2: gloo worlds of the ``--dist-world-sizes`` (NCCL with
``--conformance-backend nccl``). A check the implementation does not support
is skipped with the reason; a failure shows hypothesis's shrunk example.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import CHECKS, Implementation, hypothesis_settings, is_not_supported
from nemo_dist.testing.plugin import WorldFactory


def test_check_holds(
    conformance_case: tuple[str, int],
    conformance_impl: Implementation,
    world_factory: WorldFactory,
    pytestconfig: pytest.Config,
) -> None:
    """The named check holds for the implementation in a world of the given size."""
    name, size = conformance_case
    check = CHECKS[name]
    world = world_factory(size, pytestconfig.getoption("--conformance-backend"))
    with hypothesis_settings(pytestconfig.getoption("--conformance-max-examples"), database=True):
        try:
            check(world, conformance_impl)
        except Exception as exc:
            if is_not_supported(exc):
                pytest.skip(f"not supported: {str(exc).splitlines()[0]}")
            raise
