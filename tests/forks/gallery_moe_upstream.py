"""NeMo AutoModel 0.7.0's own expert parallelism, as a real target: its ``MoE`` layer (``Gate`` plus the default
``GroupedExperts``: tokens all-gathered, local experts, an autograd all-reduce) under its own ``apply_ep``
(``ExpertParallel``: every expert weight ``Shard(0)`` on the 1-D mesh), nothing re-expressed.

``--moe-layer tests.forks.gallery_moe_upstream:layer --moe-fn tests.forks.gallery_moe_upstream:apply_ep
--moe-compute-dtype float32``: on 2+ ranks ``GroupedExperts`` gathers the routing weights as ``weights.float()``
(and adds the experts' outputs up in float32), so it is judged within float32's rounding
(``scripts/repro_upstream_moe.py``). Needs nemo-automodel (``--no-deps``) and transformers; the suite's package
never imports either.

The layer is built tiny (12 experts of width 8 and hidden 16, top-2 of a softmax gate, a load-balance loss with
coefficient 0.01) and returns the output alone: its auxiliary loss reaches the gate through an autograd hook on
the routing weights (``MoEAuxLossAutoScaler``), per rank on its local tokens. Two things here are this
adapter's, not upstream's: the blocks upstream's ``apply_ep`` walks (``model.layers[i].mlp``), and a batch of
no tokens in one process, which upstream's layer cannot take unsharded (its expert loop indexes token 0) and
which this adapter answers with no rows. An expert-parallel layer always calls upstream's forward: the ranks'
collectives must meet.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from tests.forks._experts import OneBlock

#: The suite's layer's shape: 12 experts (whole on 1, 2, 3, 4 or 6 ranks), top-2.
EXPERTS, TOP_K, DIM, HIDDEN = 12, 2, 8, 16
#: Upstream initialises with std 0.02; a wider start makes the routing far from uniform.
INIT_STD = 0.3


class UpstreamMoE(OneBlock):
    """One block holding upstream's ``MoE`` as its ``mlp``, where upstream's ``apply_ep`` looks for it."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Upstream's ``MoE`` on ``tokens`` ``[T, dim]``; no rows for no tokens in one process."""
        moe = self.mlp
        if tokens.shape[0] == 0 and not isinstance(moe.experts.gate_and_up_projs, DTensor):
            return tokens + 0 * sum(p.sum() for p in moe.parameters())  # no rows, every parameter in the graph
        return moe(tokens)


def layer() -> nn.Module:
    """Upstream's ``MoE``, tiny, float64, on the CPU, initialised by its own ``init_weights`` (in training mode)."""
    config = importlib.import_module("nemo_automodel.components.moe.config")
    layers = importlib.import_module("nemo_automodel.components.moe.layers")
    common = importlib.import_module("nemo_automodel.components.models.common.utils")
    moe_config = config.MoEConfig(
        n_routed_experts=EXPERTS, n_shared_experts=0, n_activated_experts=TOP_K, n_expert_groups=1,
        n_limited_groups=1, train_gate=True, gate_bias_update_factor=0.0, aux_loss_coeff=0.01,
        score_func="softmax", route_scale=1.0, dim=DIM, inter_dim=HIDDEN, moe_inter_dim=HIDDEN,
        norm_topk_prob=True, dtype=torch.float64,
    )
    backend = common.BackendConfig(linear="torch", rms_norm="torch", experts="torch", dispatcher="torch")
    moe = layers.MoE(moe_config, backend)
    with torch.no_grad():
        moe.init_weights(torch.device("cpu"), init_std=INIT_STD)
    return UpstreamMoE(moe)


def apply_ep(model: nn.Module, ep_mesh: Any) -> nn.Module:
    """Upstream's ``apply_ep`` over ``ep_mesh``; in a world of one, nothing (upstream asserts a mesh of 2+)."""
    if ep_mesh.size() > 1:
        importlib.import_module("nemo_automodel.components.moe.parallelizer").apply_ep(model, ep_mesh)
    return model
