"""Every registered conformance check as a pytest test, against the implementation the options name.

Layer 2: gloo worlds of the ``--dist-world-sizes`` (NCCL with
``--conformance-backend nccl``); a check that needs no process group runs in
this process. A check the implementation does not support, or that does not
apply to what it did, is skipped with the reason; a failure shows
hypothesis's shrunk example and the likely cause; a step past its adaptive
deadline fails as a hang at once. Warnings raised inside a check are listed
in pytest's warnings summary, never failures (a fork's DeprecationWarning, say).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from nemo_dist.conformance import CHECKS, Implementation, NotApplicable, hypothesis_settings, is_not_supported
from nemo_dist.conformance._deadline import Deadlines, DeadlineWorld, StepAborted, StepHung
from nemo_dist.testing.plugin import WorldFactory


@pytest.fixture(scope="session")
def deadlines(pytestconfig: pytest.Config) -> Deadlines:
    """Adaptive step deadlines shared by the session, capped by ``--dist-timeout``."""
    return Deadlines(float(pytestconfig.getoption("dist_timeout")))


def test_check_holds(
    conformance_case: tuple[str, Implementation, int],
    world_factory: WorldFactory,
    deadlines: Deadlines,
    pytestconfig: pytest.Config,
) -> None:
    """The named check holds for the implementation in a world of the given size (or with no world)."""
    name, impl, size = conformance_case
    check = CHECKS[name]
    world: Any = None
    if size:
        world = DeadlineWorld(world_factory(size, pytestconfig.getoption("--conformance-backend")), deadlines)
    # As in the command, warnings the implementation raises are notes (pytest's warnings summary), not failures.
    max_examples = pytestconfig.getoption("--conformance-max-examples")
    with warnings.catch_warnings(), hypothesis_settings(max_examples, database=True):
        warnings.simplefilter("default")
        try:
            check(world, impl)
        except NotApplicable as exc:
            pytest.skip(f"not applicable: {exc}")
        except StepHung as hung:
            pytest.fail(f"HANG: {hung.deadline_note}\nHung step: {hung.call}\n{hung}", pytrace=False)
        except StepAborted as broke:
            pytest.fail(f"Failing step (not shrunk: it left ranks stuck or dead): {broke.call}\n{broke}", pytrace=False)
        except Exception as exc:
            if is_not_supported(exc):
                pytest.skip(f"not supported: {str(exc).splitlines()[0]}")
            cause = getattr(exc, "likely_cause", "")
            if cause:
                exc.add_note(f"Likely cause: {cause}")
            raise
