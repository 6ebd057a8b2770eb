"""Every registered conformance check as a pytest test, against the implementation the options name.

Layer 2: gloo worlds of the ``--dist-world-sizes`` (NCCL with
``--conformance-backend nccl``); a check that needs no process group runs in
this process. Options and behaviour: :mod:`nemo_dist.conformance.frontends.pytest_plugin`.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import Case
from nemo_dist.conformance.engine.deadlines import Deadlines
from nemo_dist.conformance.frontends.pytest_plugin import check_holds
from nemo_dist.testing.plugin import WorldFactory


def test_check_holds(
    conformance_case: Case,
    world_factory: WorldFactory,
    conformance_deadlines: Deadlines,
    pytestconfig: pytest.Config,
    request: pytest.FixtureRequest,
) -> None:
    """The named check holds for the implementation in a world of the given size (or with no world)."""
    check_holds(conformance_case, world_factory, conformance_deadlines, pytestconfig, request.node.nodeid)
