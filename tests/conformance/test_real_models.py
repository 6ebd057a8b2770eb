"""Layer 2: a gloo world of 2 ranks. The real-transformers checkpointing check fails forks that checkpoint wrongly.

The check (``nemo_dist.conformance.suites.real_models.checks``) builds tiny Qwen2-VL
and Qwen2-Audio models from configs on every rank, freezes a block, drives
each tower with synthetic inputs and, per scope, expects the attention and
MLP of exactly the selected trainable blocks to run again in backward. The
reference passes it (``test_every_check.py``); a fork that ignores
checkpointing, or whose selective policy saves every op's output (each
block reruns, but every op is answered from the cache), must fail it,
naming the block. Skipped without transformers
(failed under ``--require-targets``).
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, Implementation
from nemo_dist.conformance.suites.real_models.checks import checkpointing_real_models
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

targets.import_target("transformers")

_BLOCK = r"language\.0 \(model\.language_model\.layers\.0, a selected trainable block\)"


@pytest.mark.parametrize(
    ("fork", "message"),
    [
        ("broken_ddp_no_checkpointing",
         rf"Qwen2-VL, activation_checkpointing=True, scope 'all', rank \d: {_BLOCK} ran attention 0x and MLP 0x"),
        ("broken_ddp_selective_saves_every_op",
         rf"Qwen2-VL, activation_checkpointing='selective', scope 'language', rank \d: {_BLOCK} ran none of its \d+ "
         r"ops again during backward \(0 of \d+ matmuls, 0 of \d+ other ops computing a tensor; views aside\); "
         r"expected at least one"),
    ],
    ids=["ignores-checkpointing", "selective-saves-every-op"],
)
def test_a_broken_checkpointing_fork_fails_naming_the_selected_block(
    fork: str, message: str, world_factory: WorldFactory
) -> None:
    """A fork ignoring activation_checkpointing, or whose selective policy saves every op (so recomputes nothing),
    fails the core check, naming the selected block that did not rerun, or reran no other op."""
    impl = Implementation(gather=REFERENCE.gather, ddp=f"tests.forks.{fork}", config=REFERENCE.config)
    with pytest.raises(AssertionError, match=message):
        checkpointing_real_models(world_factory(2), impl)
