"""Layer 2, a gloo world of 2 (and none): a check's condition on the world's size beyond its range (``WorldRule``).

A check whose rule a world's size does not fit has no case that applies
there, in the command's expansion and in the project's tests alike, and the
runner reports it NOT APPLICABLE with the rule's own reason.
"""

from __future__ import annotations

from nemo_dist.conformance import REFERENCE, Check, Implementation, WorldLike, cases, run_case
from nemo_dist.conformance.engine.registry import WorldRule
from nemo_dist.testing.plugin import WorldFactory


def _passes(world: WorldLike, impl: Implementation) -> None:
    """Passes wherever it runs."""


EVEN = Check(
    "fake.even_worlds", "core", "gather", _passes,
    rule=WorldRule(lambda size: size % 2 == 0, "{size} ranks do not pair up"),
)


def test_a_rule_decides_which_sizes_apply() -> None:
    found = {case.world_size: case.applies for case in cases([EVEN], REFERENCE, (1, 2, 3, 4))}
    assert found == {1: False, 2: True, 3: False, 4: True}
    assert not EVEN.applies_to(3)
    assert EVEN.applies_to(4)


def test_a_world_the_rule_excludes_is_not_applicable_with_the_rules_reason(world_factory: WorldFactory) -> None:
    (odd,) = [case for case in cases([EVEN], REFERENCE, (1,)) if case.world_size == 1]
    verdict = run_case(odd, world_factory(1))
    assert (verdict.outcome, verdict.message) == ("not applicable", "1 ranks do not pair up")
    (even,) = cases([EVEN], REFERENCE, (2,))
    assert run_case(even, world_factory(2)).outcome == "pass"
