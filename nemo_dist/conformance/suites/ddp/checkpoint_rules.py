"""The checkpointing contract for one block, judged from what its counted sub-modules ran: one rule for every suite.

The ddp suite's hand-made model, the real ``transformers`` models and the
FSDP2 suite's language model each observe a block on the rank as a
*block run* (:class:`~nemo_dist.conformance.suites.ddp.messages.BlockRun`)::

    BlockRun(calls={"attn": (forward runs, runs in backward), "mlp": (...)},
             ops=OpCounts(matmuls=(in forward, in backward), others=(in forward, in backward)) or None)

``calls`` counts the ``forward`` of each counted sub-module (as the model was
built, before the implementation wrapped it); ``ops`` counts, through a
``TorchDispatchMode`` (:class:`~nemo_dist.conformance.suites.ddp.ops.OpCounter`),
the matmuls and the other ops computing a tensor (views aside) that those
sub-modules executed, with torch's checkpoint early stop off so that a
checkpointed region recomputes to its end; None where ops were not counted.

:func:`judge_block` holds a block run to the contract:

- a selected block runs each counted sub-module again in backward; any other
  block (unselected, frozen, checkpointing off) runs none, and no op, again;
- full checkpointing runs every matmul of a selected block again;
- selective checkpointing (``"selective"``) recomputes at least one op (it is
  no policy that saves every output, which saves no memory) and strictly
  fewer ops than full checkpointing of the block would, which runs each op
  of its forward once again. Which ops a policy saves (every matmul, every
  other one, attention only, all but the core attention) is the policy's
  business.

Every rule reads an observation, and each observation proves first that it
saw the work: a sub-module that never ran forward as built, or a block whose
forward ops the counter did not see, is *unobserved*. Its rule is then not
judged, and the check is NOT APPLICABLE with that reason
(:func:`raise_unobserved`) once every rule it could judge held: a count of
nothing is never a verdict on the implementation.

:func:`saves_a_matmul` is the narrower rule of torch's documented policy and
upstream's (a selected block saves at least one matmul output): an extended
promise, not the contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.suites.ddp.messages import BlockRun

__all__ = [
    "CAUSES",
    "CheckpointingFailure",
    "explained",
    "judge_block",
    "raise_unobserved",
    "saves_a_matmul",
]

#: The likely cause of each way a block breaks the contract, by key.
CAUSES = {
    "not_checkpointed": "a selected block is not checkpointed: its sub-modules do not run forward again in backward "
    "(checkpointing off for this mode, scope or world size, or applied to other modules than the blocks)",
    "wrong_block": "a block the scope does not select is checkpointed (the scope ignored, a frozen block wrapped, or "
    "another group's blocks taken)",
    "full_partial": "full checkpointing recomputes only some of the block's matmuls: a selective policy applied "
    "under activation_checkpointing=True/'full'",
    "recomputes_nothing": "'selective' recomputes nothing: its policy saves every op's output (MUST_SAVE or "
    "PREFER_SAVE for every op), which saves no memory",
    "recomputes_everything": "'selective' recomputes every op of the block, as full checkpointing does: "
    "'selective' mapped to full checkpointing, or a policy that saves no op",
    "twice": "the block recomputes more ops than full checkpointing would: it is checkpointed twice (a wrapper "
    "nested in another, or the model's own checkpointing on top)",
    "saves_no_matmul": "the selective policy saves no matmul output; torch's documented policy and upstream's save "
    "matmuls, the costly ops to recompute",
    "gradients": "checkpointing changed the gradients: the recompute differs from the forward (RNG state not "
    "preserved, a buffer or a module's state changed by the forward, or another computation recomputed)",
}


class CheckpointingFailure(AssertionError):
    """A block breaking the checkpointing contract; ``likely_cause`` names the class of the bug."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.likely_cause = CAUSES[cause]


@contextmanager
def explained(cause: str) -> Iterator[None]:
    """Attach ``CAUSES[cause]`` as the likely cause of an assertion raised inside that carries none."""
    try:
        yield
    except AssertionError as exc:
        if not getattr(exc, "likely_cause", ""):
            exc.likely_cause = CAUSES[cause]  # type: ignore[attr-defined]
        raise


def _ran(calls: dict[str, tuple[int, int]]) -> str:
    return " and ".join(f"{name} {again}x" for name, (_, again) in calls.items())


def _unrun(where: str, calls: dict[str, tuple[int, int]]) -> str | None:
    """Why the block's calls cannot be read (a counted sub-module never ran forward), or None."""
    never = [name for name, (forward, _) in calls.items() if forward == 0]
    if not never:
        return None
    return (
        f"{where}: its {' and '.join(never)} never ran forward as the model built "
        + ("it" if len(never) == 1 else "them")
        + " (replaced by the implementation?), so what it runs again in backward could not be observed"
    )


def _unseen(where: str, calls: dict[str, tuple[int, int]], what: str) -> str:
    runs = ", ".join(f"{name} {forward}x" for name, (forward, _) in calls.items())
    return (
        f"{where}: the op counter saw none of the {what} its sub-modules executed in forward (they ran: {runs}), "
        "so what it recomputes could not be observed"
    )


def judge_block(mode: bool | str, selected: bool, where: str, run: BlockRun) -> str | None:
    """Assert block run ``run`` keeps the contract of ``mode`` (:mod:`this module <.checkpoint_rules>`).

    ``selected``: whether the mode and scope select the block; ``where``
    begins every message. Raises :class:`CheckpointingFailure` with its likely
    cause; returns why a rule could not be judged (what was not observed), or
    None when every rule was.
    """
    calls = run.calls
    unrun = _unrun(where, calls)
    if unrun:
        return unrun
    again = [runs for _, runs in calls.values()]
    if selected and min(again) == 0:
        raise CheckpointingFailure(
            f"{where} ran {_ran(calls)} during backward; expected at least once each (recompute)", "not_checkpointed"
        )
    if not selected and max(again) > 0:
        raise CheckpointingFailure(f"{where} ran {_ran(calls)} during backward; expected no recompute", "wrong_block")
    ops = run.ops
    if ops is None:
        return None
    (fm, am), (fo, ao) = ops.matmuls, ops.others
    if not selected:
        if am + ao:
            raise CheckpointingFailure(
                f"{where} ran {am} matmuls and {ao} other ops again during backward; expected none (no recompute)",
                "wrong_block",
            )
        return None
    if mode != "selective":
        if fm == 0:
            return _unseen(where, calls, "matmuls")
        if am != fm:
            raise CheckpointingFailure(
                f"{where} ran {am} of its {fm} matmuls again during backward; expected all {fm} (full checkpointing "
                "recomputes every one)",
                "full_partial",
            )
        return None
    forward, recomputed = fm + fo, am + ao
    if forward == 0:
        return _unseen(where, calls, "ops")
    counted = f"{am} of {fm} matmuls, {ao} of {fo} other ops computing a tensor; views aside"
    if recomputed == 0:
        raise CheckpointingFailure(
            f"{where} ran none of its {forward} ops again during backward ({counted}); expected at least one: "
            "selective checkpointing recomputes what its policy does not save",
            "recomputes_nothing",
        )
    if recomputed > forward:
        raise CheckpointingFailure(
            f"{where} ran {recomputed} ops again during backward ({counted}) of the {forward} it ran forward; "
            f"expected at most {forward}, what full checkpointing recomputes",
            "twice",
        )
    if recomputed == forward:
        raise CheckpointingFailure(
            f"{where} ran all {forward} of its ops again during backward ({counted}); expected strictly fewer, as "
            "full checkpointing runs every one again (is 'selective' mapped to full checkpointing?)",
            "recomputes_everything",
        )
    return None


def saves_a_matmul(where: str, run: BlockRun) -> str | None:
    """Assert a block selective checkpointing selected runs fewer matmuls again than forward (it saves one).

    Returns why it could not be judged (no call or matmul observed in forward), or None.
    """
    unrun = _unrun(where, run.calls)
    if unrun:
        return unrun
    if run.ops is None:
        raise TypeError(f"{where}: a block run without its ops counted (saves_a_matmul reads its matmuls)")
    fm, am = run.ops.matmuls
    if fm == 0:
        return _unseen(where, run.calls, "matmuls")
    if am >= fm:
        raise CheckpointingFailure(
            f"{where} ran {am} of its {fm} matmuls again during backward; expected fewer (a matmul output saved)",
            "saves_no_matmul",
        )
    return None


def raise_unobserved(unobserved: list[str | None]) -> None:
    """Raise ``NotApplicable`` naming the first of ``unobserved`` (and how many more) where any is not None."""
    found = [u for u in unobserved if u]
    if not found:
        return
    more = f" (and {len(found) - 1} more observation(s) of nothing)" if len(found) > 1 else ""
    raise NotApplicable(
        f"{found[0]}{more}; every rule that could be judged held, the unobserved ones were not judged"
    )
