"""Dropout under tensor parallelism as Megatron-LM keeps it: activations replicated over the group are dropped
with the same random state on every rank of it (Megatron's ``get_cuda_rng_tracker`` keeps a per-group seed for
what is replicated), so every rank draws the same mask, the one a single process draws.

Correct. Checked on the suite's tiny Llama with dropout on attention's output
(``--tp-model tests.forks.gallery_tp_dropout_shared:model``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._tensor_parallel import megatron, tiny_model


def model() -> nn.Module:
    """The suite's tiny Llama with dropout 0.5 on attention's output (trained, so dropout acts)."""
    return tiny_model(attention_dropout=0.5)


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Megatron's split: the dropped activations stay replicated, the random state untouched."""
    return megatron(model, tp_mesh)
