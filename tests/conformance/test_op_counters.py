"""Layer 0: no process group. The checkpointing checks' op counters see a block's work under every gallery policy.

Each policy of ``tests/forks/gallery_checkpointing_*`` is applied, as its
fork applies it, to the hand-made model of the ddp suite and to the FSDP2
suite's language model, and one step runs under the rank-side observer
(:func:`~nemo_dist.conformance.suites.ddp.op_ranks.observe_blocks`) with the policy
active: every block's attention and MLP are seen running forward and every
one of its matmuls and other ops is counted there (4 matmuls and 3 other ops
per block), whatever the policy saves; what is counted again in backward is
what the contract then judges. A fork hiding its ops from dispatch modes is
seen running and counted at nothing, which the rules report as unobserved.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from nemo_dist.conformance.suites.ddp.checkpoint_rules import judge_block
from nemo_dist.conformance.suites.ddp.messages import OpCounts
from nemo_dist.conformance.suites.ddp.models import _MultimodalModel, multimodal_blocks
from nemo_dist.conformance.suites.ddp.op_ranks import counted_parts, observe_blocks
from nemo_dist.conformance.suites.fsdp2.models import blocks as lm_blocks
from nemo_dist.conformance.suites.fsdp2.models import tiny_lm
from tests.conformance.test_gallery_checkpointing import CORRECT, M
from tests.forks._checkpointing import select_blocks

#: What one block of either model runs forward: query and up (addmm), value and down (mm); softmax, mul, tanh.
FORWARD = {"matmuls": 4, "others": 3}


def _observe(model: torch.nn.Module, parts: Any, policy: str, mode: str, loss: Callable[[], torch.Tensor]) -> Any:
    checkpoint = importlib.import_module(M + policy)._checkpoint
    for parent, attribute, block in select_blocks(model, "all"):
        replacement = checkpoint(block, mode)
        if replacement is not None:
            setattr(parent, attribute, replacement)
    return observe_blocks(parts, loss)


def _hand_made(policy: str, mode: str) -> tuple[Any, set[str]]:
    torch.manual_seed(0)
    model = _MultimodalModel().double()
    found = multimodal_blocks(model)
    parts = counted_parts({name: block for name, (block, _) in found.items()})
    x = torch.randn(4, 8, dtype=torch.float64)
    runs = _observe(model, parts, policy, mode, lambda: model(x).square().mean())
    return runs, {name for name, (_, trainable) in found.items() if trainable}


def _language_model(policy: str, mode: str) -> tuple[Any, set[str]]:
    model = tiny_lm(0, torch.float64)
    parts = counted_parts(lm_blocks(model))
    tokens = torch.arange(6) % 10
    runs = _observe(model, parts, policy, mode, lambda: model(tokens).square().mean())
    return runs, set(parts)


@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("policy", CORRECT)
@pytest.mark.parametrize("build", [_hand_made, _language_model], ids=["ddp-model", "fsdp2-model"])
def test_every_forward_op_of_a_block_is_counted_with_the_policy_active(build: Any, policy: str, mode: str) -> None:
    """Under each policy, each block's sub-modules are seen running and all their ops counted in forward; the
    selected ones keep the contract in backward."""
    runs, selected = build(policy, mode)
    for name, run in runs.items():
        assert {k: forward for k, (forward, _) in run.calls.items()} == {"attn": 1, "mlp": 1}, name
        assert {"matmuls": run.ops.matmuls[0], "others": run.ops.others[0]} == FORWARD, (name, run)
        assert judge_block(mode, name in selected, name, run) is None


def test_a_fork_hiding_its_ops_is_seen_running_and_counted_at_nothing() -> None:
    """Dispatch modes switched off inside a block: its calls are seen, its ops not, and the rules say so."""
    runs, selected = _hand_made("blind", "selective")
    assert selected
    for name in selected:
        run = runs[name]
        assert {k: forward for k, (forward, _) in run.calls.items()} == {"attn": 1, "mlp": 1}
        assert run.ops == OpCounts(matmuls=(0, 0), others=(0, 0))
        assert "could not be observed" in (judge_block("selective", True, name, run) or "")
