"""Expert parallelism for a top-k mixture-of-experts layer: experts sharded on dim 0, tokens dispatched to them.

:func:`parallelize_experts` shards the stacked expert weights of a layer
(its ``experts`` module's ``w1`` and ``w2``, ``[E, ...]``) ``Shard(0)`` over a
1-D expert-parallel mesh, so each rank holds ``E / W`` whole experts, and
makes the experts' forward send every (token, expert) pair to the rank that
owns the expert (:func:`~nemo_dist.distributed.all_to_all.dispatch_tokens`),
run it there, and bring the result back
(:func:`~nemo_dist.distributed.all_to_all.combine_tokens`). The router stays
a plain parameter on every rank: its gradient is each rank's share, summed by
the data-parallel reduction the training loop already has (FSDP2 or DDP over
the same ranks).

Given a 2-D mesh named ``("edp", "ep")`` instead, expert parallelism is
borrowed from data parallelism as training composes it: the experts are
sharded over the ``ep`` sub-mesh, tokens dispatched within each expert group,
and the layer makes its own data-parallel reductions after each backward:
every expert gradient summed over its expert-data-parallel replicas
(``edp``), every other gradient summed over the world. Each rank holds its own
tokens; the result is one process's gradient of the summed loss.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from nemo_dist.distributed.all_to_all import combine_tokens, dispatch_tokens

__all__ = ["parallelize_experts"]


def _local(weight: Any) -> torch.Tensor:
    return weight.to_local() if isinstance(weight, DTensor) else weight


def _local_experts(received: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Each received row through its local expert (``local[i]`` indexes this rank's ``w1``/``w2``)."""
    parts = []
    for e in range(w1.shape[0]):  # every local expert, those that received nothing too: their weights stay in the graph
        rows = torch.nonzero(local == e).reshape(-1)
        parts.append((rows, torch.nn.functional.silu(received[rows] @ w1[e]) @ w2[e]))
    out = received.new_zeros(received.shape)
    for rows, value in parts:
        out = out.index_copy(0, rows, value)
    return out


def _forward(self: nn.Module, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    w1, w2 = _local(self.w1), _local(self.w2)
    per_rank = w1.shape[0]
    k = indices.shape[1]
    pairs = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(k)
    experts = indices.reshape(-1)
    received, route = dispatch_tokens(tokens[pairs], torch.div(experts, per_rank, rounding_mode="floor"),
                                      self.ep_group)
    local = route.dispatch(experts) % per_rank
    out = combine_tokens(_local_experts(received, local, w1, w2), route)
    return tokens.new_zeros(tokens.shape).index_add(0, pairs, out * weights.reshape(-1, 1))


def _sum_after_backward(param: nn.Parameter, group: Any) -> None:
    """After each backward, sum ``param``'s local gradient (a DTensor's local shard) over ``group``."""

    def reduce(p: torch.Tensor) -> None:
        assert p.grad is not None  # the hook runs once a gradient was accumulated
        dist.all_reduce(_local(p.grad), group=group)

    param.register_post_accumulate_grad_hook(reduce)


def parallelize_experts(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard ``layer.experts``' ``w1``/``w2`` ``Shard(0)`` over the expert-parallel mesh and dispatch tokens to them.

    ``ep_mesh`` is 1-D (the experts over all of it; the other parameters' gradients left to the training loop's
    data-parallel reduction), or 2-D named ``("edp", "ep")``: the experts over ``ep_mesh["ep"]``, and after each
    backward every expert gradient summed over ``edp`` and every other gradient over the world (the layer's
    data parallelism is its own). The number of experts must split evenly over ep (``ValueError`` naming both,
    raised before anything is sharded, on every rank alike). Returns ``layer``, changed in place.
    """
    composed = ep_mesh.ndim == 2
    if ep_mesh.ndim not in (1, 2) or (composed and tuple(ep_mesh.mesh_dim_names or ()) != ("edp", "ep")):
        raise ValueError(f"parallelize_experts: expects a 1-D mesh or a 2-D one named ('edp', 'ep'); got "
                         f"{ep_mesh.ndim} dims named {ep_mesh.mesh_dim_names}")
    experts_mesh = ep_mesh["ep"] if composed else ep_mesh
    experts = layer.get_submodule("experts")
    count, size = experts.get_parameter("w1").shape[0], experts_mesh.size()
    if count % size:
        raise ValueError(f"parallelize_experts: {count} experts do not split over an expert-parallel mesh of {size}")
    for name in ("w1", "w2"):
        weight = getattr(experts, name)
        setattr(experts, name, nn.Parameter(distribute_tensor(weight.detach(), experts_mesh, [Shard(0)])))
    experts.ep_group = experts_mesh.get_group()
    experts.forward = types.MethodType(_forward, experts)
    if composed:
        expert_params = {id(p) for p in experts.parameters()}
        for param in layer.parameters():
            group = ep_mesh["edp"].get_group() if id(param) in expert_params else dist.group.WORLD
            _sum_after_backward(param, group)
    return layer
