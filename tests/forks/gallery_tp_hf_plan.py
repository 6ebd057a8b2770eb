"""Hugging Face's own plan for an architecture (``config.base_model_tp_plan`` and the class's ``_tp_plan``, style
names as transformers 5 writes them) applied with torch's styles, here on Qwen3, whose per-head
``q_norm``/``k_norm`` are "replicated_with_grad_allreduce": kept whole, their gradients summed over the group.

Correct. Checked on a tiny Qwen3 (``--tp-model tests.forks.gallery_tp_hf_plan:qwen3``; needs transformers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nemo_dist.distributed.tensor_parallel import parallelize_tp, translate_hf_plan

#: The tiny config every gallery Hugging Face model is built from (float64, nothing downloaded).
TINY = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "pad_token_id": 0}


def build(name: str) -> nn.Module:
    """A tiny transformers model of class ``name``, eager attention, float64."""
    import transformers

    cls = getattr(transformers, name)
    config = cls.config_class(**TINY)
    config._attn_implementation = "eager"
    return cls(config).to(torch.float64)


def qwen3() -> nn.Module:
    """A tiny Qwen3ForCausalLM."""
    return build("Qwen3ForCausalLM")


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The model's Hugging Face plan, translated, applied."""
    return parallelize_tp(model, tp_mesh, tp_shard_plan=translate_hf_plan(model))
