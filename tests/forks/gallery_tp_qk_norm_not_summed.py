"""Per-head ``q_norm``/``k_norm`` left plain under tensor parallelism (AutoModel PR 1190; upstream 0.7.0's Qwen3
and Gemma3 plans until the training recipe's replica sync): the norms run on each rank's own heads, so each rank's
gradient of their weights covers its heads only and nobody sums them.

Broken: tp.gradients_equal_unsharded fails, naming replicated gradients left partial per rank. Checked on a tiny
Qwen3 (``--tp-model tests.forks.gallery_tp_hf_plan:qwen3``; needs transformers).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from nemo_dist.distributed.tensor_parallel import ReplicatedGradientSum, parallelize_tp, translate_hf_plan


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Hugging Face's plan without its gradient sums of the per-head norms."""
    chosen = {k: v for k, v in translate_hf_plan(model).items() if not isinstance(v, ReplicatedGradientSum)}
    return parallelize_tp(model, tp_mesh, tp_shard_plan=chosen)
