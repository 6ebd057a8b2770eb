"""Hugging Face transformers 5.25's own expert parallelism, as a real target: a Qwen3-MoE sparse block
(``Qwen3MoeSparseMoeBlock``: ``Qwen3MoeTopKRouter`` plus ``Qwen3MoeExperts``) under the model's own
``base_model_ep_plan`` (``grouped_gemm`` on ``experts.gate_up_proj`` / ``experts.down_proj``: ``Shard(0)`` on the
1-D mesh; ``ep_dispatch_experts`` on ``experts``: the tokens exchanged by ``AllToAllEP``), applied by
``transformers.distributed.expert_parallel.apply_expert_parallelism``, nothing re-expressed.

``--moe-layer tests.forks.gallery_moe_hf_ep:layer --moe-fn tests.forks.gallery_moe_hf_ep:apply_ep``: judged at
float64's tolerance (1e-10), which it meets on 1 to 4 ranks although the router takes its softmax in float32
(``softmax(..., dtype=torch.float)``): both sides round the same float64 logits the same way. ``layer`` runs the
experts' eager loop (the modeling file's own forward); ``layer_batched_mm`` the ``batched_mm`` implementation
(transformers issue 48687's). A model's default, ``grouped_mm``, cannot run in float64 on the CPU at all, sharded
or not (``torch._grouped_mm``: "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double").

The block is built tiny (12 experts, top-2 renormalised, hidden 8, moe intermediate 16, SiLU, float64, weights
drawn with std 0.3) inside a one-layer ``Qwen3MoeForCausalLM`` built from a config (so the experts implementation is
dispatched as in a model); nothing downloaded. It returns the output alone (Qwen3-MoE's load-balance loss lives
in the causal LM, over all layers' router logits). What is this adapter's, not upstream's: the ``[T, dim]`` to
``[1, T, dim]`` reshape, the holder (``layers.0.mlp``) that gives the plan's ``layers.*.mlp`` names, and the
size-1 TP mesh that ``DistributedConfig(fsdp_size=W, ep_size=W)`` would give; the suite's sum of plain gradients
stands in for that configuration's FSDP on the router. In a world of one nothing is applied (``ep_size`` 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import OneBlock

#: The suite's layer's shape: 12 experts (whole on 1, 2, 3, 4 or 6 ranks), top-2.
EXPERTS, TOP_K, DIM, HIDDEN = 12, 2, 8, 16
#: Qwen3-MoE initialises with std 0.02; a wider start makes the routing far from uniform.
INIT_STD = 0.3


class HFSparseMoe(OneBlock):
    """One block holding ``Qwen3MoeSparseMoeBlock`` as ``layers.0.mlp``, where the plan's names point."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The block on ``tokens`` ``[T, dim]`` (as a batch of one sequence)."""
        return self.mlp(tokens.unsqueeze(0)).squeeze(0)


def _build(experts_implementation: str) -> nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=16, hidden_size=DIM, intermediate_size=HIDDEN, moe_intermediate_size=HIDDEN, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=4, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        norm_topk_prob=True, initializer_range=INIT_STD, experts_implementation=experts_implementation,
    )
    model = Qwen3MoeForCausalLM(config).to(torch.float64)
    return HFSparseMoe(model.model.layers[0].mlp)


def layer() -> nn.Module:
    """The block with the eager experts loop."""
    return _build("eager")


def layer_batched_mm() -> nn.Module:
    """The block with ``batched_mm`` experts (transformers issue 48687's)."""
    return _build("batched_mm")


def apply_ep(model: nn.Module, ep_mesh: Any) -> nn.Module:
    """The config's ``base_model_ep_plan``, expanded and applied by transformers over ``ep_mesh``; in a world of
    one, nothing (transformers applies its EP plan only for ``ep_size > 1``)."""
    if ep_mesh.size() == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism
    from transformers.distributed.mixin import DistributedMixin

    experts = model.layers[0].mlp.experts
    plan = DistributedMixin._expand_parallel_plan(model, dict(experts.config.base_model_ep_plan))  # type: ignore[arg-type]
    tp_mesh = init_device_mesh(ep_mesh.device_type, (ep_mesh.size(), 1), mesh_dim_names=("ep", "tp"))["tp"]
    return apply_expert_parallelism(model, ep_mesh, tp_mesh, plan, ep_implementation="auto")
