"""Layer 2: a gloo world of 2 ranks. The real-transformers checkpointing check fails a fork that ignores it.

The check (``nemo_dist.conformance.real_models.checks``) builds tiny Qwen2-VL
and Qwen2-Audio models from configs on every rank, freezes a block, drives
each tower with synthetic inputs and, per scope, expects the attention and
MLP of exactly the selected trainable blocks to run again in backward. The
reference passes it (``test_every_check.py``); a fork that ignores
checkpointing must fail it, naming the block. Skipped without transformers
(failed under ``--require-targets``).
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, Implementation
from nemo_dist.conformance.real_models.checks import checkpointing_real_models
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

targets.import_target("transformers")

NO_CHECKPOINTING = Implementation(
    gather=REFERENCE.gather, ddp="tests.forks.broken_ddp_no_checkpointing", config=REFERENCE.config
)


def test_ignored_checkpointing_fails_naming_a_selected_block_that_did_not_rerun(world_factory: WorldFactory) -> None:
    """A fork that ignores activation_checkpointing fails the core check, naming the block that did not rerun."""
    message = (
        r"Qwen2-VL, activation_checkpointing=True, scope 'all', rank \d: language\.0 "
        r"\(model\.language_model\.layers\.0, a selected trainable block\) ran attention 0x and MLP 0x"
    )
    with pytest.raises(AssertionError, match=message):
        checkpointing_real_models(world_factory(2), NO_CHECKPOINTING)
