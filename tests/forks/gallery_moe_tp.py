"""Expert parallelism composed with tensor parallelism (``--moe-mesh edp,ep,tp``), checked under
``--moe-reduction mean``: the ranks of a tp group hold the same tokens (a TP block's input is replicated).

Two correct ways to run the experts, and the public bug of each:

- ``replicated``: every tp rank runs its batch's every token through the experts (experts replicated over tp, as
  upstream's ``apply_ep`` leaves them with tensor parallelism); each tp rank's gradients are then already whole,
  so experts are averaged over edp and the router over the data-parallel ranks, each tp group counted once.
- ``tokens_counted_tp_times``: the same, with the expert gradients also summed over tp: every token counted once
  per tp rank, x tp (what upstream's gradient scaling divides out with its tp replication factor, AutoModel
  PR 2995).
- ``split``: each tp rank takes its share of the batch's tokens (every tp-th) through the experts and the partial
  outputs are summed over tp, as torchtitan's TP2EP with its reorderer splits the routed tokens; the gradient of
  the routing weights and of the tokens is summed over tp in backward (torchtitan PR 2416's fix), the experts
  averaged over edp and tp.
- ``split_router_not_reduced``: the same without summing the routing weights' gradient over tp: each tp rank's
  router sees only its share's gradient and the replicas of the router drift apart (torchtitan #2387).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.forks._composition import composed, group_over


class _GradSummed(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group`` (Megatron's copy to the tp region)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Summed(torch.autograd.Function):
    """Forward sums over ``group``; backward passes the gradient on (every rank's loss sees the same sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _split_over_tp(layer: nn.Module, mesh: Any, reduce_weights: bool) -> None:
    """Make ``layer.experts`` take this tp rank's share of the tokens (every tp-th) and sum the partial outputs
    over tp; in backward the tokens' gradient, and with ``reduce_weights`` the routing weights', summed over tp."""
    experts, group = layer.experts, mesh["tp"].get_group()
    dispatch, rank, size = experts.forward, mesh["tp"].get_local_rank(), mesh["tp"].size()

    def forward(self: nn.Module, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        tokens = _GradSummed.apply(tokens, group)
        if reduce_weights:
            weights = _GradSummed.apply(weights, group)
        mine = torch.arange(tokens.shape[0])[rank::size]
        partial = tokens.new_zeros(tokens.shape).index_copy(0, mine, dispatch(tokens[mine], indices[mine],
                                                                               weights[mine]))
        return _Summed.apply(partial, group)

    experts.forward = types.MethodType(forward, experts)


def replicated(layer: nn.Module, mesh: Any) -> nn.Module:
    """Every tp rank runs every token: experts averaged over edp, the router over edp and ep."""
    return composed(layer, mesh)


def tokens_counted_tp_times(layer: nn.Module, mesh: Any) -> nn.Module:
    """Every tp rank runs every token, and the experts are summed over tp as well: x tp."""
    return composed(layer, mesh, experts_over=("edp", "tp"))


def split(layer: nn.Module, mesh: Any) -> nn.Module:
    """Each tp rank runs its share of the tokens: experts averaged over edp and tp, the router over the data-parallel
    ranks after the routing weights' gradient is summed over tp."""
    composed(layer, mesh, experts_over=("edp", "tp"))
    _split_over_tp(layer, mesh, reduce_weights=True)
    return layer


def split_router_not_reduced(layer: nn.Module, mesh: Any) -> nn.Module:
    """:func:`split` without summing the routing weights' gradient over tp (torchtitan #2387)."""
    composed(layer, mesh, experts_over=("edp", "tp"))
    _split_over_tp(layer, mesh, reduce_weights=False)
    return layer


__all__ = ["group_over", "replicated", "split", "split_router_not_reduced", "tokens_counted_tp_times"]
