"""Keyword inputs that reach the first stage only (Megatron-LM #752's, ColossalAI #430's class): every later stage's
module is written for hidden states alone (``forward(hidden_states, **kwargs)``, the keyword inputs assumed to be the
first stage's business) and drops the packed ``position_ids`` its step hands it. Its layers run with the default
positions ``0..seq-1``: without keyword inputs it is torchtitan's correct split; with packed positions the loss and
every gradient differ from one process's, and torch raises nothing."""

from __future__ import annotations

from typing import Any

from tests.forks._pipelines import Loss, manual


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split, every stage after the first dropping its keyword inputs."""
    return manual(model, pp_mesh, n_microbatches, loss_fn, keywords_first_only=True)
