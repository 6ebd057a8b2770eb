"""Layer 0: no process group. The checkpointing contract for one block, rule by rule, on hand-made block runs.

:func:`~nemo_dist.conformance.suites.ddp.checkpoint_rules.judge_block` is the one rule
the ddp, real-model and FSDP2 checkpointing checks share: these tests feed it
the block runs a rank reports and assert its verdict, its message and its
likely cause, and that a run whose observation saw nothing is reported as
unobserved (the check's NOT APPLICABLE), never judged.
"""

from __future__ import annotations

from typing import Any

import pytest

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.suites.ddp.checkpoint_rules import (
    CAUSES,
    CheckpointingFailure,
    judge_block,
    raise_unobserved,
    saves_a_matmul,
)
from nemo_dist.conformance.suites.ddp.messages import BlockRun, OpCounts

WHERE = "language.0"


def _run(again: tuple[int, int], ops: tuple[tuple[int, int], tuple[int, int]] | None, forward: int = 1) -> BlockRun:
    """A block run: attn and mlp each ran ``forward`` times forward and ``again`` times in backward."""
    calls = {"attn": (forward, again[0]), "mlp": (forward, again[1])}
    return BlockRun(calls=calls, ops=None if ops is None else OpCounts(matmuls=ops[0], others=ops[1]))


@pytest.mark.parametrize(
    ("ops", "cause"),
    [
        (((4, 0), (3, 0)), "recomputes_nothing"),
        (((4, 4), (3, 3)), "recomputes_everything"),
        (((4, 4), (3, 4)), "twice"),
    ],
    ids=["saves-every-op", "saves-no-op", "recomputes-twice"],
)
def test_selective_outside_its_contract_fails_naming_the_class(ops: Any, cause: str) -> None:
    """Selective must recompute at least one op and strictly fewer than full; each way out names its class."""
    with pytest.raises(CheckpointingFailure) as raised:
        judge_block("selective", True, WHERE, _run((1, 1), ops))
    assert raised.value.likely_cause == CAUSES[cause]
    assert str(raised.value).startswith(f"{WHERE} ran ")


@pytest.mark.parametrize(
    "ops",
    [((4, 0), (3, 3)), ((4, 2), (3, 3)), ((4, 0), (3, 1)), ((4, 4), (3, 0))],
    ids=["save-matmuls", "alternating", "core-attention-only", "save-the-rest-recompute-matmuls"],
)
def test_any_policy_that_saves_something_and_recomputes_something_is_selective(ops: Any) -> None:
    """Which ops a policy saves is its business: every matmul, every other one, all but the core attention, or
    only the non-matmuls."""
    assert judge_block("selective", True, WHERE, _run((1, 1), ops)) is None


@pytest.mark.parametrize("mode", [True, "selective"])
def test_a_counter_that_saw_no_forward_op_is_unobserved_not_judged(mode: bool | str) -> None:
    """Zero ops seen in a forward that ran is an observation of nothing: reported, never "N of its 0"."""
    reason = judge_block(mode, True, WHERE, _run((1, 1), ((0, 0), (0, 0))))
    assert reason is not None
    assert "the op counter saw none of the" in reason
    assert "could not be observed" in reason
    assert "of its 0" not in reason


def test_a_sub_module_that_never_ran_forward_is_unobserved_not_judged() -> None:
    """A counted sub-module the implementation replaced never runs as built: its recompute is not read."""
    reason = judge_block(True, True, WHERE, _run((0, 0), ((4, 4), (3, 3)), forward=0))
    assert reason is not None
    assert "never ran forward as the model built them" in reason


def test_unobserved_rules_make_the_check_not_applicable_naming_the_first() -> None:
    """The check is NOT APPLICABLE with the first reason and how many more; nothing unobserved raises nothing."""
    raise_unobserved([None, None])
    with pytest.raises(NotApplicable, match=r"^first \(and 1 more observation"):
        raise_unobserved([None, "first", "second"])


@pytest.mark.parametrize(
    ("mode", "selected", "run", "cause"),
    [
        (True, True, _run((0, 0), ((4, 0), (3, 0))), "not_checkpointed"),
        (True, False, _run((1, 1), ((4, 4), (3, 3))), "wrong_block"),
        (False, False, _run((0, 0), ((4, 1), (3, 0))), "wrong_block"),
        (True, True, _run((1, 1), ((4, 2), (3, 3))), "full_partial"),
    ],
    ids=["selected-not-rerun", "unselected-rerun", "off-but-an-op-reran", "full-saving-matmuls"],
)
def test_recompute_of_the_wrong_blocks_or_amount_fails_naming_the_class(
    mode: bool | str, selected: bool, run: Any, cause: str
) -> None:
    """Selected blocks rerun, others do not; full checkpointing reruns every matmul."""
    with pytest.raises(CheckpointingFailure) as raised:
        judge_block(mode, selected, WHERE, run)
    assert raised.value.likely_cause == CAUSES[cause]


def test_the_extended_rule_asks_a_saved_matmul_and_sees_first() -> None:
    """Upstream's narrower rule: fewer matmuls again than forward; a blind count is unobserved."""
    assert saves_a_matmul(WHERE, _run((1, 1), ((4, 2), (3, 3)))) is None
    with pytest.raises(CheckpointingFailure) as raised:
        saves_a_matmul(WHERE, _run((1, 1), ((4, 4), (3, 0))))
    assert raised.value.likely_cause == CAUSES["saves_no_matmul"]
    assert saves_a_matmul(WHERE, _run((1, 1), ((0, 0), (3, 0)))) is not None
