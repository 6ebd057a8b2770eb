"""An auxiliary loss injected in backward, as upstream's and Megatron's ``MoEAuxLossAutoScaler`` inject it, under a
composition that multiplies each rank's loss by the data-parallel size and averages every gradient over the
data-parallel ranks (FSDP2's reduce-scatter): the aux gradient, outside the loss multiplier, comes out averaged.

Checked as ``--moe-layer tests.forks.gallery_moe_aux:layer --moe-mesh edp,ep --moe-reduction sum --moe-loss-scale
@dp --moe-aux-reduction mean``:

- ``averaged_over_dp``: the injected gradient at weight 1 before the average: the ranks' auxiliary losses averaged
  over the data-parallel ranks, as upstream's recipe gives them. Conforms.
- ``averaged_over_ep``: the aux loss averaged over the expert-parallel group where the data-parallel ranks are
  meant (the Megatron-LM #3672 class): weight 1/ep, right only where ep is the data-parallel size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nemo_dist.conformance.suites.moe.layer import TinyMoE
from nemo_dist.conformance.suites.moe.target import AUX_WEIGHT
from tests.forks._composition import composed, sizes_of


class _AuxInjected(torch.autograd.Function):
    """Identity on the routing weights; backward adds the auxiliary loss's gradient at ``scale``, whatever the
    loss's own gradient (Megatron's ``MoEAuxLossAutoScaler``)."""

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return weights.view_as(weights)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


class InjectedAuxMoE(TinyMoE):
    """The suite's layer returning its output alone, its load-balance loss (times the suite's aux weight, times
    ``aux_scale``) injected into backward through the routing weights."""

    aux_scale = 1.0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """The output for ``tokens``; the auxiliary loss reaches the router in backward only."""
        scores, indices, weights = self.route(tokens)
        aux = self.load_balance_loss(scores, indices)
        if aux.requires_grad:
            weights = _AuxInjected.apply(weights, AUX_WEIGHT * aux, self.aux_scale)
        return self.experts(tokens, indices, weights)


def layer() -> nn.Module:
    """:class:`InjectedAuxMoE` of the suite's shape."""
    return InjectedAuxMoE()


def averaged_over_dp(model: nn.Module, mesh: Any) -> nn.Module:
    """Every gradient averaged over the data-parallel ranks; the aux gradient injected at weight 1."""
    return composed(model, mesh)


def averaged_over_ep(model: nn.Module, mesh: Any) -> nn.Module:
    """The same, the aux gradient injected at dp / ep, so that it comes out averaged over the ep group."""
    sizes = sizes_of(mesh)
    composed(model, mesh)
    model.aux_scale = sizes["dp"] / sizes["ep"]
    return model
