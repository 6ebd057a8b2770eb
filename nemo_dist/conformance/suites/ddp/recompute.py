"""The parent side of the checkpointing checks on the hand-made model: which blocks recompute, and how much.

:func:`check_recompute` runs :func:`~nemo_dist.conformance.suites.ddp.op_ranks.checkpoint_recompute`
on every rank and holds each block's run, per scope, to the checkpointing
contract (:func:`~nemo_dist.conformance.suites.ddp.checkpoint_rules.judge_block`:
exactly the selected trainable blocks run again; full checkpointing every
matmul, selective at least one op and strictly fewer than full), the
gradients to those without checkpointing. A rule whose observation saw
nothing is not judged, and the check is then not applicable, naming it.
:func:`check_saves_a_matmul` holds selected blocks to the narrower rule of
torch's documented policy and upstream's, from the same run.

The checks are ``sampled``: in the worlds where
:func:`~nemo_dist.conformance.engine.registry.thorough` is False (a run's worlds of
three ranks or more, where its smallest world of two or more checks every
scope) they check one scope, ``SAMPLE_SCOPE`` unless a check names another:
it selects two of the model's groups and leaves the third, so a scope ignored,
a group taken for another or checkpointing switched off by the world's size
still fails there.
"""

from __future__ import annotations

import torch

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, thorough
from nemo_dist.conformance.suites.ddp import op_ranks
from nemo_dist.conformance.suites.ddp.checkpoint_rules import explained, judge_block, raise_unobserved, saves_a_matmul
from nemo_dist.conformance.suites.ddp.expectations import (
    CHECKPOINT_SCOPES,
    TOLERANCE_TIGHT,
    assert_close_lists,
    checkpoint_role,
    tolerance_for,
)
from nemo_dist.conformance.suites.ddp.messages import Recompute

__all__ = ["SAMPLE_SCOPE", "check_recompute", "check_saves_a_matmul"]

#: The scope a sampled world checks: two groups selected, one not.
SAMPLE_SCOPE = "language,vision"


def _results(world: WorldLike, impl: Implementation, mode: bool | str, scopes: tuple[str, ...]) -> list[Recompute]:
    global_x = torch.randn(2 * world.size, 8, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    return world.run(op_ranks.checkpoint_recompute, impl, mode, list(scopes), global_x)


def _where(mode: bool | str, scope: str, rank: int, block: str, what: str) -> str:
    return f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: {block} ({what})"


def check_recompute(
    world: WorldLike,
    impl: Implementation,
    mode: bool | str,
    scopes: tuple[str, ...] = CHECKPOINT_SCOPES,
    sample: str = SAMPLE_SCOPE,
) -> None:
    """Assert, on every rank and for each of ``scopes``, the recompute and gradients checkpointing ``mode`` gives.

    Where the run samples (:func:`~nemo_dist.conformance.engine.registry.thorough` False), for ``sample`` alone.
    """
    if not thorough():
        scopes = (sample,)
    unobserved = []
    for rank, got in enumerate(_results(world, impl, mode, scopes)):
        for scope in scopes:
            run = got.scopes[repr(scope)]
            for block, block_run in run.runs.items():
                selected, what = checkpoint_role(mode, got.trainable[block], block.split(".")[0], scope)
                unobserved.append(judge_block(mode, selected, _where(mode, scope, rank, block, what), block_run))
            with explained("gradients"):
                assert_close_lists(
                    run.grads,
                    got.plain_grads,
                    f"activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}: gradients vs no checkpointing",
                    tolerance_for(got.dtype, TOLERANCE_TIGHT),
                )
    raise_unobserved(unobserved)


def check_saves_a_matmul(world: WorldLike, impl: Implementation) -> None:
    """Assert, on every rank, that selective checkpointing's selected blocks save a matmul output (run fewer again).

    Reads the run of the core check (:func:`check_recompute` with ``"selective"``), sampled alike.
    """
    scopes = CHECKPOINT_SCOPES if thorough() else (SAMPLE_SCOPE,)
    unobserved = []
    for rank, got in enumerate(_results(world, impl, "selective", scopes)):
        for scope in scopes:
            for block, block_run in got.scopes[repr(scope)].runs.items():
                selected, what = checkpoint_role("selective", got.trainable[block], block.split(".")[0], scope)
                if selected:
                    unobserved.append(saves_a_matmul(_where("selective", scope, rank, block, what), block_run))
    raise_unobserved(unobserved)
