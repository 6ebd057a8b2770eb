"""How the moe suite reads an expert-parallel layer on a rank: whole tensors, placements, shards, digests.

A DTensor is read whole with ``full_tensor()`` (a collective over its
mesh), a rank-local parameter (:mod:`~nemo_dist.conformance.suites.moe.local`) put
together from every rank's rows, a plain one as it is. Each function that
reads a DTensor whole is a collective: every rank calls it on the same
parameters in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from nemo_dist.conformance.suites.ddp.sharded import full, shards
from nemo_dist.conformance.suites.ddp.sharded import whole_grad as sharded_whole_grad
from nemo_dist.conformance.suites.gather.ranks import _device
from nemo_dist.conformance.suites.moe.local import LocalRows
from nemo_dist.conformance.suites.moe.target import AUX_WEIGHT, outputs

__all__ = [
    "chunks_match",
    "difference",
    "digest",
    "full",
    "grad_or_zeros",
    "held_experts",
    "layer_loss",
    "local_part",
    "loss_of",
    "placements_of",
    "shard_digests",
    "whole",
    "whole_grad",
]


def difference(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """max |got - want| relative to max(1, max |want|); None when the shapes differ."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.shape != want.shape:
        return None
    if not got.numel():
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def whole(param: Any, rows: LocalRows | None) -> torch.Tensor:
    """The parameter whole: a DTensor's ``full_tensor()``, a rank-local one put together, a plain one as it is."""
    return rows.whole(param) if rows is not None else full(param)


def whole_grad(param: nn.Parameter, rows: LocalRows | None, summed: bool = True) -> torch.Tensor:
    """The parameter's whole gradient: a DTensor's ``full_tensor()`` (zeros where no rank's shard got one), a
    rank-local one's put together, a plain (replicated) one's summed over the world where ``summed`` (the suite
    standing in for data parallelism), else this rank's as it is (a composition reduces it itself). A shard or a
    rank-local parameter with no gradient on its rank (its experts received no token) counts as zeros there."""
    if rows is not None:
        return rows.whole(grad_or_zeros(param).detach())
    if isinstance(param, DTensor):
        grad = sharded_whole_grad(param, param.grad)  # every rank joins the collective, with a gradient or without
        assert grad is not None
        return grad
    local = grad_or_zeros(param).detach().clone()
    if summed:
        dist.all_reduce(local)
    return local


def grad_or_zeros(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s gradient, or zeros of its shape where it has none."""
    return torch.zeros_like(tensor) if tensor.grad is None else tensor.grad


def loss_of(out: Any, aux: Any, projection: torch.Tensor, aux_weight: float = 1.0) -> torch.Tensor:
    """The loss every check backpropagates: ``sum(output * projection) + aux_weight * AUX_WEIGHT * aux`` (no aux:
    the sum)."""
    loss = (full(out) * projection.to(_device())).sum()
    return loss if aux is None else loss + aux_weight * AUX_WEIGHT * full(aux)


def layer_loss(
    layer: nn.Module, x: torch.Tensor, projection: torch.Tensor, aux_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``layer`` called on tokens ``x``: ``(loss_of its outputs, output, aux_loss or None)``."""
    out, aux = outputs(layer(x.to(_device())))
    return loss_of(out, aux, projection, aux_weight), out, aux


def placements_of(layer: nn.Module, local: dict[str, LocalRows]) -> dict[str, str]:
    """How each parameter of ``layer`` is held: ``Shard(0)``, other DTensor placements, rank-local rows, ``plain``."""
    return {
        name: ("Shard(0)" if [repr(p) for p in param.placements] == ["Shard(dim=0)"] else
               ",".join(repr(p) for p in param.placements)) if isinstance(param, DTensor)
        else local[name].label() if name in local else "plain"
        for name, param in layer.named_parameters()
    }


def local_part(whole: torch.Tensor, param: DTensor) -> torch.Tensor | None:
    """The part of ``whole`` (a tensor of ``param``'s full shape) this rank holds under ``param``'s placements.

    Each ``Shard(d)`` on mesh dim i keeps chunk ``c`` (this rank's coordinate
    on that mesh dim, not its global rank) of ``torch.chunk(part, mesh.size(i),
    d)``, mesh dims in order, as DTensor lays shards out; a rank outside the
    mesh holds nothing. None for a strided shard, whose layout this does not
    model.
    """
    mesh = param.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return whole.narrow(0, 0, 0)
    part = whole
    for i, placement in enumerate(param.placements):
        if "Strided" in type(placement).__name__:
            return None
        if placement.is_shard():
            dim = placement.dim  # type: ignore[attr-defined]
            chunks = torch.chunk(part, mesh.size(i), dim=dim)
            part = chunks[coordinate[i]] if coordinate[i] < len(chunks) else part.narrow(dim, 0, 0)
    return part


def chunks_match(layer: nn.Module) -> list[str]:
    """The DTensor parameters whose local shard is not the ``torch.chunk`` share their placements give this rank's
    coordinate on their own mesh (:func:`local_part`)."""
    wrong = []
    for name, param in layer.named_parameters():
        if isinstance(param, DTensor) and any(shards(p) for p in param.placements):
            mine = local_part(param.full_tensor(), param)
            if mine is not None and not torch.equal(param.to_local(), mine):
                wrong.append(name)
    return wrong


def held_experts(layer: nn.Module, local: dict[str, LocalRows], experts: int) -> list[int] | None:
    """The experts (indices into dim 0 of the unsharded stacked weights) this rank holds: read from the first
    parameter of ``experts`` rows sharded on dim 0 (a DTensor's placements, or rank-local rows); None if none is."""
    for name, param in layer.named_parameters():
        if name in local and local[name].full_rows == experts:
            return list(local[name].owners[dist.get_rank()])
        if isinstance(param, DTensor) and param.dim() and param.shape[0] == experts and any(
            p.is_shard() and getattr(p, "dim", None) == 0 for p in param.placements
        ):
            index = torch.arange(experts).reshape(experts, *([1] * (param.dim() - 1))).expand(param.shape)
            part = local_part(index, param)
            if part is not None:
                return part.reshape(part.shape[0], -1)[:, 0].tolist() if part.numel() else []
    return None


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def shard_digests(layer: nn.Module, local: dict[str, LocalRows]) -> dict[str, tuple[Any, str]]:
    """Each sharded parameter's ``(where, digest)`` on this rank: ``where`` says which part it holds (the rank's
    coordinate on the DTensor's shard dims, or the rank-local rows), so ranks holding the same part (replicas over
    expert-data parallelism) can be compared bit for bit."""
    found: dict[str, tuple[Any, str]] = {}
    for name, param in layer.named_parameters():
        if name in local:
            found[name] = (tuple(local[name].owners[dist.get_rank()]), digest(param))
        elif isinstance(param, DTensor) and any(shards(p) for p in param.placements):
            coordinate: Sequence[int] = param.device_mesh.get_coordinate() or ()
            where = tuple((i, c) for i, (c, p) in enumerate(zip(coordinate, param.placements, strict=False))
                          if shards(p))
            found[name] = (where, digest(param.to_local()))
    return found
