"""What the expert-parallel gallery rows share: experts sharded on dim 0, and a token dispatch whose pieces a row
may get wrong (the owner of an expert, the routing weights' autograd), written with torch's functional
collectives as torchtitan's dispatcher is."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def shard_experts(layer: nn.Module, mesh: Any) -> int:
    """``layer.experts``' ``w1``/``w2`` as ``Shard(0)`` DTensors over ``mesh``; the experts each rank holds."""
    experts = layer.experts
    for name in ("w1", "w2"):
        setattr(experts, name, nn.Parameter(distribute_tensor(getattr(experts, name).detach(), mesh, [Shard(0)])))
    return experts.w1.shape[0] // mesh.size()


def local_mlp(rows: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Row i through this rank's expert ``local[i]`` (SiLU MLP); every local expert stays in the graph."""
    out = rows.new_zeros(rows.shape)
    for e in range(w1.shape[0]):
        at = torch.nonzero(local == e).reshape(-1)
        out = out.index_copy(0, at, torch.nn.functional.silu(rows[at] @ w1[e]) @ w2[e])
    return out


def _exchange(rows: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), received, sent, group))


def dispatch_forward(
    per_rank: int, group: Any, *, owner: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None,
    local: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None, detach_weights: bool = False,
    compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = local_mlp,
    detach_tokens: bool = False, weights_twice: bool = False,
) -> Callable[..., torch.Tensor]:
    """An experts ``forward(tokens, indices, weights)``: (token, expert) pairs sorted by owner, counts exchanged,
    tokens and expert ids sent with the autograd all-to-all, computed (``compute(rows, local ids, w1, w2)``, default
    :func:`local_mlp`), sent back, unsorted, weighted and summed. The bugs a row may build in: the routing weights
    or the sent tokens detached, the weights applied twice."""
    size = dist.get_world_size(group)
    owner = owner or (lambda e, per, _size: torch.div(e, per, rounding_mode="floor"))
    local = local or (lambda e, per, _size: e % per)

    def forward(self: nn.Module, tokens: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w1 = self.w1.to_local() if isinstance(self.w1, DTensor) else self.w1
        w2 = self.w2.to_local() if isinstance(self.w2, DTensor) else self.w2
        k = indices.shape[1]
        pairs = torch.arange(tokens.shape[0]).repeat_interleave(k)
        experts = indices.reshape(-1)
        dest = owner(experts, per_rank, size)
        order = torch.sort(dest, stable=True).indices
        sent = torch.bincount(dest, minlength=size)
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=group)
        sent_l, received_l = sent.tolist(), received.tolist()
        outgoing = tokens[pairs][order]
        rows = _exchange(outgoing.detach() if detach_tokens else outgoing, received_l, sent_l, group)
        ids = torch.empty(sum(received_l), dtype=experts.dtype)
        dist.all_to_all_single(ids, experts[order].contiguous(), received_l, sent_l, group=group)
        back = _exchange(compute(rows, local(ids, per_rank, size), w1, w2), sent_l, received_l, group)
        out = torch.empty_like(back).index_copy(0, order, back)
        scale = weights.detach() if detach_weights else weights
        scale = scale * scale if weights_twice else scale
        return tokens.new_zeros(tokens.shape).index_add(0, pairs, out * scale.reshape(-1, 1))

    return forward


def dispatched(
    layer: nn.Module, mesh: Any, *, held: Callable[[int, int, int], list[int]] | None = None, **routing: Any
) -> nn.Module:
    """``layer`` with its experts sharded (``Shard(0)`` DTensors, or with ``held`` the rank-local rows
    :func:`local_experts` keeps) and dispatched to (``routing``: :func:`dispatch_forward`'s keywords)."""
    per_rank = shard_experts(layer, mesh) if held is None else local_experts(layer, mesh, held)
    layer.experts.forward = types.MethodType(dispatch_forward(per_rank, mesh.get_group(), **routing), layer.experts)
    return layer


class OneBlock(nn.Module):
    """A model of one block whose ``mlp`` is a mixture-of-experts layer: ``layers.0.mlp``, where a library's expert
    parallelism (upstream's ``apply_ep``, transformers' EP plan) looks for it. Subclasses say how tokens reach it."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        block = nn.Module()
        block.mlp = mlp
        self.layers = nn.ModuleList([block])

    @property
    def mlp(self) -> nn.Module:
        """The held layer."""
        return self.layers[0].mlp


def local_experts(layer: nn.Module, mesh: Any, held: Callable[[int, int, int], list[int]]) -> int:
    """``layer.experts``' ``w1``/``w2`` replaced by plain parameters of the rows ``held(rank, size, count)``:
    rank-local experts, no DTensor saying where they are. Returns the experts each rank holds."""
    experts = layer.experts
    size, rank = mesh.size(), mesh.get_local_rank()
    rows = held(rank, size, experts.w1.shape[0])
    for name in ("w1", "w2"):
        setattr(experts, name, nn.Parameter(getattr(experts, name).detach()[rows].clone()))
    return len(rows)
