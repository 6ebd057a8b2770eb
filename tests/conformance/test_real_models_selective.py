"""Layer 2: a gloo world of 2 ranks. The real-transformers check fails a selective policy that recomputes nothing.

``tests/forks/broken_ddp_selective_saves_every_op`` checkpoints the selected
blocks with a selective policy saving every op's output: each block's
``forward`` runs again in backward, but every op is answered from the cache.
The real-model check counts the ops of each block's attention and MLP and
must fail it, naming the block and the other ops it did not run again.
Skipped without transformers (failed under ``--require-targets``).
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, Implementation
from nemo_dist.conformance.real_models.checks import checkpointing_real_models
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

targets.import_target("transformers")

SAVES_EVERY_OP = Implementation(
    gather=REFERENCE.gather, ddp="tests.forks.broken_ddp_selective_saves_every_op", config=REFERENCE.config
)


def test_selective_saving_every_op_fails_naming_a_block_that_recomputed_nothing(world_factory: WorldFactory) -> None:
    """A selective policy saving every op fails the core check: a selected block ran no other op again."""
    message = (
        r"Qwen2-VL, activation_checkpointing='selective', scope 'language', rank \d: language\.0 "
        r"\(model\.language_model\.layers\.0, a selected trainable block\) ran 0 of its \d+ other ops "
        r"\(not matmuls, not views\) again during backward; expected at least one"
    )
    with pytest.raises(AssertionError, match=message):
        checkpointing_real_models(world_factory(2), SAVES_EVERY_OP)
