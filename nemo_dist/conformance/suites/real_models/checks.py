"""Conformance checks of activation checkpointing on tiny real ``transformers`` models.

The checkpointing checks of the ddp suite use a hand-made model; these build
tiny models of real ``transformers`` classes on every rank
(:mod:`~nemo_dist.conformance.suites.real_models.ranks`: random init, float64, nothing downloaded), count how often
each block's attention and MLP run forward during backward, and compare the
gradients with an unwrapped, uncheckpointed copy. A block is *selected* by a
scope when its layer group is in the scope ("all": every group the model
has; "multimodal": vision and audio); a selected block with a trainable
parameter must run its attention, and its MLP where it has one, again in
backward; any other block (unselected, frozen, or checkpointing off) must
run neither again. Under selective checkpointing a selected block's
attention and MLP must also recompute at least one op and strictly fewer than
full checkpointing would (:mod:`~nemo_dist.conformance.suites.ddp.checkpoint_rules`,
the contract every suite shares); an observation that saw nothing makes the
check not applicable, naming it, never a failure.

Upstream (nemo-automodel 0.7.0) passes the core check at every world size:
its full checkpointing wraps each selected block's attention, MLP and norms
(a Whisper-like audio block has no MLP module, only fc1/fc2, so only its
attention reruns: the check counts the MLP only where the block has one);
selective wraps whole blocks; in a world of one it returns the model
unwrapped but checkpointed the same way. Its other world-of-one path, the
model's own ``gradient_checkpointing_enable()``, is taken only for full
checkpointing of scope "all" on a model whose only group is "language"; the
core architectures (Qwen2-VL, Qwen2-Audio) have two groups, so it is not
what they exercise, and it would satisfy the check anyway (it reruns whole
decoder layers, every group selected).

Beyond upstream (extended): Whisper's encoder is the audio group and its
decoder the language group. Upstream's discovery files both stacks under
"language" and keeps one of them, so scope "audio" checkpoints nothing.

Without ``transformers`` in the parent process each check is skipped, before
it touches the world, saying how to install it.
"""

from __future__ import annotations

import importlib.util
import unittest

from nemo_dist.conformance.engine.deadlines import warm_up
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check, thorough
from nemo_dist.conformance.suites.ddp.checkpoint_rules import explained, judge_block, raise_unobserved
from nemo_dist.conformance.suites.ddp.expectations import (
    TOLERANCE_FLOAT64,
    assert_close_lists,
    checkpoint_role,
    lists_plainly_close,
    tolerance_for,
)
from nemo_dist.conformance.suites.real_models import ranks

__all__ = [
    "CORE_ARCHITECTURES",
    "MISSING_TRANSFORMERS",
    "PRELOAD",
    "REAL_MODEL_SCOPES",
    "TOLERANCE_REAL_MODELS",
    "checkpointing_real_models",
    "checkpointing_real_models_beyond_upstream",
]

#: The architectures of the core check (upstream and nemo_dist group them alike).
CORE_ARCHITECTURES = ("Qwen2-VL", "Qwen2-Audio")
#: The scopes full checkpointing runs (those naming a group the model lacks are left out).
REAL_MODEL_SCOPES = ("all", "language", "vision", "audio", "multimodal")
#: Checkpointed vs plain gradients: float64, same ops recomputed (DDP's average of equal grads may round).
TOLERANCE_REAL_MODELS = TOLERANCE_FLOAT64
#: Why a check is skipped when the parent cannot import transformers.
MISSING_TRANSFORMERS = (
    "install transformers (pip install transformers) to run the checkpointing checks on real transformers models"
)


#: What the rank side imports: imported once for every rank where ranks are forked.
PRELOAD = (
    "transformers",
    "transformers.models.qwen2_vl.modeling_qwen2_vl",
    "transformers.models.qwen2_audio.modeling_qwen2_audio",
    "transformers.models.whisper.modeling_whisper",
)


def _require_transformers() -> None:
    """Raise ``unittest.SkipTest`` when ``transformers`` is not installed where this process imports from.

    Only looked up, not imported (importing it costs this process a second);
    the ranks import it, and :func:`_warm_up` skips where they cannot.
    """
    if importlib.util.find_spec("transformers") is None:
        raise unittest.SkipTest(MISSING_TRANSFORMERS)


def _warm_up(world: WorldLike, architectures: tuple[str, ...]) -> None:
    """Build each architecture once on every rank; skip, naming the error, where a rank cannot import transformers."""
    for rank, got in enumerate(warm_up(world, ranks.warm_up, list(architectures))):
        if got.get("import_error") is not None:
            raise unittest.SkipTest(f"{MISSING_TRANSFORMERS} (rank {rank}: {got['import_error']})")


def _check_architecture(
    world: WorldLike, impl: Implementation, architecture: str, mode: bool | str, scopes: tuple[str, ...]
) -> list[str | None]:
    """Run ``ranks.recompute_counts`` on every rank; assert each block run keeps the contract, gradients unchanged.

    Returns what could not be observed (:func:`~nemo_dist.conformance.suites.ddp.checkpoint_rules.judge_block`).
    """
    unobserved = []
    results = world.run(ranks.recompute_counts, impl, architecture, mode, list(scopes))
    for rank, got in enumerate(results):
        blocks = got["blocks"]
        for scope in scopes:
            run = got["scopes"][scope]
            where = f"{architecture}, activation_checkpointing={mode!r}, scope {scope!r}, rank {rank}"
            for name, block_run in run["runs"].items():
                block = blocks[name]
                selected, what = checkpoint_role(mode, block["trainable"], name.split(".")[0], scope)
                unobserved.append(judge_block(mode, selected, f"{where}: {name} ({block['path']}, {what})", block_run))
            assert len(run["grads"]) == len(got["plain_grads"]), (
                f"{where}: {len(run['grads'])} parameters after wrapping, {len(got['plain_grads'])} before"
            )
            tolerance = tolerance_for(got["dtype"], TOLERANCE_REAL_MODELS)
            if lists_plainly_close(run["grads"], got["plain_grads"], tolerance):
                continue
            for name, actual, plain in zip(got["names"], run["grads"], got["plain_grads"], strict=True):
                with explained("gradients"):
                    assert_close_lists(
                        [actual],
                        [plain],
                        f"{where}: gradient of {name} vs the uncheckpointed model",
                        tolerance,
                    )
    return unobserved


def _check_architectures(
    world: WorldLike,
    impl: Implementation,
    architectures: tuple[str, ...],
    scopes: tuple[str, ...],
    selective_scopes: tuple[str, ...],
) -> None:
    """Full checkpointing on every scope that names the model's groups, selective on a few, and off once.

    The hand-made model of the ddp suite covers every mode and scope; here
    the point is which blocks real classes group where, so a scope naming a
    group the model lacks is left out and selective runs a sample. Where
    the run samples (:func:`~nemo_dist.conformance.engine.registry.thorough` False:
    its worlds of three ranks or more) only full checkpointing of the first
    scope runs; the hand-made model's checks prove the other modes there.
    """
    _require_transformers()
    _warm_up(world, architectures)
    unobserved = []
    for architecture in architectures:
        groups = set(ranks.ARCHITECTURES[architecture].groups)
        present = tuple(s for s in scopes if s in ("all", "multimodal") or s in groups)
        if not thorough():
            unobserved += _check_architecture(world, impl, architecture, True, present[:1])
            continue
        unobserved += _check_architecture(world, impl, architecture, True, present)
        unobserved += _check_architecture(world, impl, architecture, "selective", selective_scopes)
        unobserved += _check_architecture(world, impl, architecture, False, ("all",))
    raise_unobserved(unobserved)


@check("ddp.checkpointing_real_models", tier="core", component="ddp", preload=PRELOAD, sampled=True)
def checkpointing_real_models(world: WorldLike, impl: Implementation) -> None:
    """On tiny real Qwen2-VL and Qwen2-Audio, each scope reruns exactly its trainable blocks; gradients unchanged."""
    _check_architectures(world, impl, CORE_ARCHITECTURES, REAL_MODEL_SCOPES, ("language", "multimodal"))


@check("ddp.checkpointing_real_models_beyond_upstream", tier="extended", component="ddp", preload=PRELOAD, sampled=True)
def checkpointing_real_models_beyond_upstream(world: WorldLike, impl: Implementation) -> None:
    """On a tiny real Whisper, scope "audio" reruns the encoder blocks only and "language" the decoder blocks only."""
    _check_architectures(world, impl, ("Whisper",), ("audio", "language", "all"), ("audio",))
