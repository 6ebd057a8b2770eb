"""The parent side of the checkpointing checks on the hand-made model: which blocks recompute, and how much.

:func:`check_recompute` runs :func:`~nemo_dist.conformance.ddp.op_ranks.checkpoint_recompute`
on every rank and asserts, per scope and block, that exactly the selected
trainable blocks ran their attention and MLP again during backward, that the
number of matmuls they ran again fits the mode (all of them for full
checkpointing, fewer for selective, none when off), and that the gradients
equal those without checkpointing.
"""

from __future__ import annotations

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
from nemo_dist.conformance.registry import WorldLike

__all__ = ["check_recompute"]


def _matmul_expectation(mode: bool | str, selected: bool, matmuls: int, forward: int) -> str | None:
    """What is wrong with a block recomputing ``matmuls`` of its ``forward`` matmuls in backward, or None."""
    if not selected:
        return None if matmuls == 0 else "none (no recompute)"
    if mode == "selective":
        if matmuls < forward:
            return None
        return f"strictly fewer than {forward} (is 'selective' mapped to full checkpointing?)"
    return None if matmuls == forward else f"all {forward} (full checkpointing recomputes every one)"


def check_recompute(
    world: WorldLike, impl: Implementation, mode: bool | str, scopes: tuple[str, ...] = CHECKPOINT_SCOPES
) -> None:
    """Assert, on every rank and for each of ``scopes``, the recompute and gradients checkpointing ``mode`` gives."""
    global_x = torch.randn(2 * world.size, 8, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    results = world.run(op_ranks.checkpoint_recompute, impl, mode, list(scopes), global_x)
    for rank, got in enumerate(results):
        for scope in scopes:
            run = got["scopes"][repr(scope)]
            for block, (attn, mlp, matmuls, forward) in run["recomputed"].items():
                selected, what = checkpoint_role(mode, got["trainable"][block], block.split(".")[0], scope)
                ran_again = attn > 0 and mlp > 0
                ran_never = attn == 0 and mlp == 0
                where = f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: {block} ({what})"
                assert ran_again if selected else ran_never, (
                    f"{where} ran attn {attn}x and mlp {mlp}x during backward; expected "
                    + ("at least once each (recompute)" if selected else "no recompute")
                )
                wrong = _matmul_expectation(mode, selected, matmuls, forward)
                assert wrong is None, (
                    f"{where} ran {matmuls} of its {forward} matmuls again during backward; expected {wrong}"
                )
            assert_close_lists(
                run["grads"],
                got["plain_grads"],
                f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: gradients vs no checkpointing",
                tolerance_for(got["dtype"], TOLERANCE_TIGHT),
            )
