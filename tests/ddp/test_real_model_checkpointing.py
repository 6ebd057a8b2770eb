"""Layer 2: gloo worlds of 2 ranks. Activation checkpointing on tiny real transformers models.

Each test runs a check of ``nemo_dist.conformance.model_checks``: tiny
Qwen2-VL and Qwen2-Audio (core) and Whisper (beyond upstream) built from
configs on every rank, a block frozen, each tower driven with synthetic
inputs; per scope, the attention and MLP of exactly the selected trainable
blocks run again in backward and the gradients equal the uncheckpointed
model's. The same check must fail on a fork that ignores checkpointing.
Skipped without transformers.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, Implementation, model_checks
from nemo_dist.testing.plugin import WorldFactory

pytest.importorskip("transformers")

NO_CHECKPOINTING = Implementation(
    gather=REFERENCE.gather, ddp="tests.forks.broken_ddp_no_checkpointing", config=REFERENCE.config
)


@pytest.mark.parametrize("api", ["parallelize_ddp", "DDPManager"])
def test_each_scope_reruns_exactly_its_trainable_blocks_of_qwen2_vl_and_qwen2_audio(
    world_factory: WorldFactory, api: str
) -> None:
    """Full and selective rerun exactly the selected trainable blocks of real Qwen2-VL/Qwen2-Audio, same gradients."""
    model_checks.checkpointing_real_models(world_factory(2), REFERENCE.with_ddp_api(api))


def test_whisper_audio_scope_reruns_the_encoder_and_language_the_decoder(world_factory: WorldFactory) -> None:
    """On real Whisper, scope "audio" reruns only encoder blocks and "language" only decoder blocks."""
    model_checks.checkpointing_real_models_beyond_upstream(world_factory(2), REFERENCE)


def test_ignored_checkpointing_fails_naming_a_selected_block_that_did_not_rerun(world_factory: WorldFactory) -> None:
    """A fork that ignores activation_checkpointing fails the core check, naming the block that did not rerun."""
    message = (
        r"Qwen2-VL, activation_checkpointing=True, scope 'all', rank \d: language\.0 "
        r"\(model\.language_model\.layers\.0, a selected trainable block\) ran attention 0x and MLP 0x"
    )
    with pytest.raises(AssertionError, match=message):
        model_checks.checkpointing_real_models(world_factory(2), NO_CHECKPOINTING)
