"""The parent side of the checkpointing checks on the hand-made model: which blocks recompute, and how much.

:func:`check_recompute` runs :func:`~nemo_dist.conformance.ddp.op_ranks.checkpoint_recompute`
on every rank and asserts, per scope and block, that exactly the selected
trainable blocks ran their attention and MLP again during backward, that what
they ran again fits the mode, and that the gradients equal those without
checkpointing. What fits the mode:

- full checkpointing runs every matmul of a selected block again;
- selective checkpointing runs strictly fewer matmuls again than the block ran
  forward (never more than full checkpointing would), and at least one of its
  other ops: a policy that saves every op's output recomputes nothing and
  saves no memory;
- a block that is not selected (or checkpointing off) runs no op again.

The checks are ``sampled``: in the worlds where
:func:`~nemo_dist.conformance.registry.thorough` is False (a run's worlds of
three ranks or more, where its smallest world of two or more checks every
scope) they check one scope, ``SAMPLE_SCOPE`` unless a check names another:
it selects two of the model's groups and leaves the third, so a scope ignored,
a group taken for another or checkpointing switched off by the world's size
still fails there.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.conformance.ddp import op_ranks
from nemo_dist.conformance.ddp.expectations import (
    CHECKPOINT_SCOPES,
    TOLERANCE_TIGHT,
    assert_close_lists,
    checkpoint_role,
    tolerance_for,
)
from nemo_dist.conformance.implementation import Implementation
from nemo_dist.conformance.registry import WorldLike, thorough

__all__ = ["SAMPLE_SCOPE", "check_recompute", "matmul_expectation", "other_ops_expectation"]

#: The scope a sampled world checks: two groups selected, one not.
SAMPLE_SCOPE = "language,vision"


def matmul_expectation(mode: bool | str, selected: bool, matmuls: int, forward: int) -> str | None:
    """What is wrong with a block recomputing ``matmuls`` of its ``forward`` matmuls in backward, or None."""
    if not selected:
        return None if matmuls == 0 else "none (no recompute)"
    if mode == "selective":
        if matmuls > forward:
            return f"at most {forward}, as full checkpointing runs each once again (does a block recompute twice?)"
        if matmuls < forward:
            return None
        return f"strictly fewer than {forward} (is 'selective' mapped to full checkpointing?)"
    return None if matmuls == forward else f"all {forward} (full checkpointing recomputes every one)"


def other_ops_expectation(mode: bool | str, selected: bool, others: int) -> str | None:
    """What is wrong with a block running ``others`` of its non-matmul ops again in backward, or None."""
    if not selected:
        return None if others == 0 else "none (no recompute)"
    if mode == "selective" and others == 0:
        return (
            "at least one (selective checkpointing recomputes what its policy does not save; a policy "
            "saving every op's output recomputes nothing and saves no memory)"
        )
    return None


def _check_block(mode: bool | str, selected: bool, where: str, counts: dict[str, Any]) -> None:
    """Assert what one block ran again in backward (``counts``, as ``checkpoint_recompute`` gives it) fits."""
    attn, mlp = counts["attn"], counts["mlp"]
    ran_again = attn > 0 and mlp > 0
    ran_never = attn == 0 and mlp == 0
    assert ran_again if selected else ran_never, (
        f"{where} ran attn {attn}x and mlp {mlp}x during backward; expected "
        + ("at least once each (recompute)" if selected else "no recompute")
    )
    forward, matmuls = counts["matmuls"]
    wrong = matmul_expectation(mode, selected, matmuls, forward)
    assert wrong is None, f"{where} ran {matmuls} of its {forward} matmuls again during backward; expected {wrong}"
    forward, others = counts["others"]
    wrong = other_ops_expectation(mode, selected, others)
    assert wrong is None, (
        f"{where} ran {others} of its {forward} other ops (not matmuls, not views) again during backward; "
        f"expected {wrong}"
    )


def check_recompute(
    world: WorldLike,
    impl: Implementation,
    mode: bool | str,
    scopes: tuple[str, ...] = CHECKPOINT_SCOPES,
    sample: str = SAMPLE_SCOPE,
) -> None:
    """Assert, on every rank and for each of ``scopes``, the recompute and gradients checkpointing ``mode`` gives.

    Where the run samples (:func:`~nemo_dist.conformance.registry.thorough` False), for ``sample`` alone.
    """
    if not thorough():
        scopes = (sample,)
    global_x = torch.randn(2 * world.size, 8, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    results = world.run(op_ranks.checkpoint_recompute, impl, mode, list(scopes), global_x)
    for rank, got in enumerate(results):
        for scope in scopes:
            run = got["scopes"][repr(scope)]
            for block, counts in run["recomputed"].items():
                selected, what = checkpoint_role(mode, got["trainable"][block], block.split(".")[0], scope)
                where = f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: {block} ({what})"
                _check_block(mode, selected, where, counts)
            assert_close_lists(
                run["grads"],
                got["plain_grads"],
                f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: gradients vs no checkpointing",
                tolerance_for(got["dtype"], TOLERANCE_TIGHT),
            )
