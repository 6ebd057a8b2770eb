"""DTensor parameters and gradients seen whole, and how a model's parameters are sharded (rank side).

A sharded wrapper (FSDP2's ``fully_shard``, HSDP) leaves a model's
parameters and gradients as DTensors, each rank holding a shard of each; a
module it left alone keeps plain tensors among them. The checks compare,
copy and report whole tensors: :func:`full` is a DTensor's full tensor and
anything else as it is. It is a collective for a DTensor: every rank must
call it on the same tensors in the same order, as the rank functions do (they
walk ``model.parameters()`` on every rank alike). :func:`sharding` says how
each parameter is held, for the report.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["cpu_copy", "full", "grad_copy", "is_sharded", "sharding", "shards", "whole_grad"]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of ``tensor``: a DTensor's full tensor (a collective over its mesh), any other tensor itself."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of ``tensor`` (always a copy, never an alias of a bucket or parameter).

    A DTensor's copy is of its full tensor (:func:`full`): a collective, so
    every rank copies the same tensors in the same order.
    """
    return full(tensor.detach()).to("cpu", copy=True)


def whole_grad(param: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
    """``grad``, ``param``'s gradient, whole (:func:`full`); None where ``param`` is plain and has none.

    A collective for a DTensor parameter on every rank of its mesh, whether or
    not this rank's shard got a gradient: a shard that took no part in the
    loss (experts that received no token) has none on its rank while the
    other ranks' shards have one, and the ranks must all join the full
    tensor's collective. A zero shard in the parameter's own placements
    stands in for a missing one, so the whole gradient is zeros there.
    """
    if _is_dtensor(param) and not _is_dtensor(grad):
        local = param.to_local()
        grad = type(param).from_local(
            torch.zeros_like(local) if grad is None else grad.reshape(local.shape), param.device_mesh,
            param.placements, run_check=False, shape=param.shape, stride=param.stride(),
        )
    return None if grad is None else full(grad)


def grad_copy(param: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
    """A detached CPU copy of ``grad``, ``param``'s gradient, whole (:func:`whole_grad`; a collective for a
    DTensor), or None where this rank holds none."""
    whole = whole_grad(param, grad)
    return None if whole is None or grad is None else whole.detach().to("cpu", copy=True)


def is_sharded(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor."""
    return any(_is_dtensor(t) for t in tensors)


def shards(placement: Any) -> bool:
    """Whether a DTensor ``placement`` splits the tensor over its mesh dim: a ``Shard``, or the ``_StridedShard``
    FSDP2 lays over a dim another mesh dim already shards (its ``is_shard()`` is False in torch 2.13)."""
    return bool(placement.is_shard()) or type(placement).__name__.lstrip("_") == "StridedShard"


def _is_dtensor(value: Any) -> TypeGuard[DTensor]:
    # Importing torch.distributed.tensor costs most of a second (sympy); where nothing imported it, nothing is one.
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def _mesh_text(tensor: DTensor) -> str:
    mesh = tensor.device_mesh
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    dims = ", ".join(f"{name}={size}" for name, size in zip(names, mesh.shape, strict=True))
    return f"mesh ({dims})"


def sharding(model: nn.Module) -> list[str]:
    """How each parameter of ``model`` is held on this rank, one line each.

    A DTensor: its placements, its mesh's dimensions (name=size) and its local
    shape against its full one (``weight: DTensor (Shard(dim=0),) over mesh
    (dp_shard=2), local [1, 4] of [2, 4]``); a plain tensor: its shape.
    """
    lines = []
    for name, p in model.named_parameters():
        if _is_dtensor(p):
            local = list(p.to_local().shape)
            lines.append(
                f"{name}: DTensor {tuple(p.placements)} over {_mesh_text(p)}, local {local} of {list(p.shape)}"
            )
        else:
            lines.append(f"{name}: plain tensor {list(p.shape)}")
    return lines
