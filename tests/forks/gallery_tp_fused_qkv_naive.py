"""A fused query-key-value projection split naively (``ColwiseParallel`` on Phi-3's ``qkv_proj``): a plain
column split gives rank 0 the queries and rank 1 the keys and values, not each rank its own heads of all three
(Hugging Face's Phi-3 plan gathers the output instead, "colwise_gather_output").

Broken: the forward fails. Checked on a tiny Phi-3 (``--tp-model tests.forks.gallery_tp_fused_qkv_naive:phi3``;
needs transformers).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.forks.gallery_tp_hf_plan import build


def phi3() -> nn.Module:
    """A tiny Phi3ForCausalLM."""
    return build("Phi3ForCausalLM")


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The fused projections split column-wise as if they were one matrix each."""
    return parallelize_module(model, tp_mesh, {
        "model.layers.*.self_attn.qkv_proj": ColwiseParallel(),
        "model.layers.*.self_attn.o_proj": RowwiseParallel(),
        "model.layers.*.mlp.gate_up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
    })
