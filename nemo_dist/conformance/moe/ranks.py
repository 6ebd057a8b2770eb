"""Rank side of the moe checks: one layer under expert parallelism against one process, every difference reported.

Every rank builds the same seeded unsharded layer and every rank's seeded
tokens (counts uneven, a rank with none among them), so each computes the
one-process reference itself: the unsharded layer on each rank's tokens, the
loss summed over ranks (``sum(output * projection) + AUX_WEIGHT * aux``).
The expert-parallel copy runs on this rank's tokens only. The gradient of
this rank's tokens (what backpropagates to the layers before) is compared
with one process's gradient of the same tokens. Parameter gradients are
compared whole: a DTensor's ``full_tensor()``; a rank-local parameter's
(:mod:`~nemo_dist.conformance.moe.local`) put together from every rank's
rows; a plain parameter's gradient is this rank's share, summed over the
world (the data-parallel reduction a training loop adds). The steps take
that sum, then the optimizer's step.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from nemo_dist.conformance.ddp.sharded import whole_grad
from nemo_dist.conformance.gather.ranks import _device
from nemo_dist.conformance.implementation import Implementation
from nemo_dist.conformance.moe.local import LocalRows, find
from nemo_dist.conformance.moe.target import (
    AUX_WEIGHT,
    build_layer,
    dim_of,
    outputs,
    parallelize,
    routed_experts,
    steer,
    steerable,
)
from nemo_dist.conformance.moe.variants import VARIANTS, pair_contributions, variant_forward

__all__ = ["run", "tokens"]

_MESHES: dict[tuple[str, int], Any] = {}


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    device = _device().type
    key = (device, dist.get_world_size())
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device, (key[1],), mesh_dim_names=("ep",))
    return _MESHES[key]


def tokens(seed: int, rank: int, count: int, dim: int, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s ``count`` seeded tokens (``salt`` 1: its output projection), float64."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + salt)
    return torch.randn(count, dim, generator=generator, dtype=torch.float64)


def _full(tensor: Any) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _difference(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """max |got - want| relative to max(1, max |want|); None when the shapes differ."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.shape != want.shape:
        return None
    if not got.numel():
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _whole(param: Any, rows: LocalRows | None) -> torch.Tensor:
    """The parameter whole: a DTensor's ``full_tensor()``, a rank-local one put together, a plain one as it is."""
    return rows.whole(param) if rows is not None else _full(param)


def _whole_grad(param: nn.Parameter, rows: LocalRows | None) -> torch.Tensor:
    """The parameter's whole gradient: a DTensor's ``full_tensor()`` (zeros where no rank's shard got one), a
    rank-local one's put together, a plain (replicated) one's summed over the world. A shard or a rank-local
    parameter with no gradient on its rank (its experts received no token) counts as zeros there."""
    if rows is not None:
        return rows.whole(_grad_or_zeros(param).detach())
    if isinstance(param, DTensor):
        grad = whole_grad(param, param.grad)  # every rank joins the collective, with a gradient or without
        assert grad is not None
        return grad
    local = _grad_or_zeros(param).detach().clone()
    dist.all_reduce(local)
    return local


def _grad_or_zeros(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(tensor) if tensor.grad is None else tensor.grad


def _loss(layer: nn.Module, x: torch.Tensor, projection: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
    out, aux = outputs(layer(x.to(_device())))
    loss = (_full(out) * projection.to(_device())).sum()
    return (loss if aux is None else loss + AUX_WEIGHT * _full(aux)), out, aux


def _placements(layer: nn.Module, local: dict[str, LocalRows]) -> dict[str, str]:
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


def _chunks_match(layer: nn.Module) -> list[str]:
    """The DTensor parameters whose local shard is not the ``torch.chunk`` share their placements give this rank's
    coordinate on their own mesh (:func:`local_part`)."""
    wrong = []
    for name, param in layer.named_parameters():
        if isinstance(param, DTensor) and any(p.is_shard() for p in param.placements):
            mine = local_part(param.full_tensor(), param)
            if mine is not None and not torch.equal(param.to_local(), mine):
                wrong.append(name)
    return wrong


def _held_experts(layer: nn.Module, local: dict[str, LocalRows], experts: int) -> list[int] | None:
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


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _sum_plain_grads(layer: nn.Module, local: dict[str, LocalRows]) -> None:
    """Sum the replicated (plain, not rank-local) parameters' gradients over the world, as data parallelism would."""
    for name, param in layer.named_parameters():
        if not isinstance(param, DTensor) and name not in local and param.grad is not None:
            dist.all_reduce(param.grad)


def run(
    impl: Implementation, counts: Sequence[int], seed: int, steps: Sequence[tuple[str, int]], muted: Sequence[int] = (),
    diagnose: bool = False,
) -> dict[str, Any]:
    """One example: forward, backward and ``steps`` of the expert-parallel layer and of one process; what differs.

    ``counts[r]`` tokens on rank r; ``muted`` experts the router is steered away from (:func:`~.target.steer`), so
    that chosen ranks receive no (token, expert) pair. The target's errors are not caught: a rank that raises shows
    its exception (the harness reports every rank's), and the ranks it leaves waiting are reported stuck, not hung.
    ``received_pairs`` is how many pairs one process routes to the experts this rank holds (None where the layer's
    routing or placement cannot be read). With ``diagnose``, ``values`` holds what was compared (CPU tensors) and
    what one process gives with each known bug built in (:func:`_diagnosis`).
    """
    me = dist.get_rank()
    reference = build_layer(impl, seed).to(_device())
    if muted:
        steer(reference, muted)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    layer = parallelize(impl, copy.deepcopy(reference), _mesh())
    dim = dim_of(reference)
    xs = [tokens(seed, r, n, dim) for r, n in enumerate(counts)]
    projections = [tokens(seed, r, n, dim, salt=1) for r, n in enumerate(counts)]
    local, found_problems = find(layer, before)
    found: dict[str, Any] = {
        "placements": _placements(layer, local), "chunks_wrong": _chunks_match(layer), "local_problems": found_problems,
        "received_pairs": _received_pairs(reference, layer, local, xs),
    }
    found["start"] = {
        name: _difference(_whole(p, local.get(name)), before[name]) for name, p in layer.named_parameters()
        if name in before
    }
    mine = xs[me].clone().requires_grad_(True)
    loss, out, aux = _loss(layer, mine, projections[me])
    loss.backward()
    reference_loss = torch.zeros((), dtype=torch.float64, device=_device())
    want_out = want_aux = None
    theirs = [x.clone().requires_grad_(True) for x in xs]
    for r in range(len(counts)):
        part, o, a = _loss(reference, theirs[r], projections[r])
        reference_loss = reference_loss + part
        if r == me:
            want_out, want_aux = o, a
    reference_loss.backward()
    assert want_out is not None
    found["tokens_grad"] = _difference(_grad_or_zeros(mine), _grad_or_zeros(theirs[me]))
    found["out"] = _difference(_full(out), want_out)
    found["aux"] = None if aux is None or want_aux is None else _difference(_full(aux), want_aux)
    found["has_aux"] = aux is not None
    reference_params = dict(reference.named_parameters())
    found["grads"] = {
        name: _difference(_whole_grad(p, local.get(name)), _grad_or_zeros(reference_params[name]))
        for name, p in layer.named_parameters() if name in reference_params
    }
    if diagnose:
        found["values"] = _diagnosis(reference, layer, local, xs, projections, me, (out, aux, mine, want_out, want_aux,
                                                                                   theirs[me]))
    found["steps"] = _train(layer, reference, xs, projections, steps, me, local)
    found["replicated_digests"] = {
        name: _digest(p.to_local() if isinstance(p, DTensor) else p) for name, p in layer.named_parameters()
        if name not in local and (not isinstance(p, DTensor) or not any(pl.is_shard() for pl in p.placements))
    }
    return found


def _cpu(tensor: Any) -> torch.Tensor | None:
    return None if tensor is None else _full(tensor).detach().double().cpu().clone()


def _param_grads(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient of ``loss`` for each of ``params`` (zeros where it does not reach one), outside ``.grad``."""
    found = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else [None] * len(params)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, found, strict=True)]


def _diagnosis(
    reference: nn.Module, layer: nn.Module, local: dict[str, LocalRows], xs: list[torch.Tensor],
    projections: list[torch.Tensor], me: int, compared: tuple[Any, ...],
) -> dict[str, Any]:
    """What the checks compared, whole, on CPU, and what one process gives with each known bug built in.

    ``out``, ``aux``, ``tokens_grad``: ``(got, want)`` for this rank; ``grads``: ``{name: (got, want)}`` whole;
    ``own_share``: each parameter's gradient from this rank's tokens alone (what a gradient never summed over ranks
    is); ``pairs``: what each of this rank's (token, expert) pairs adds to one process's output; ``variants``:
    ``{kind: {"out", "aux", "tokens_grad", "grads"}}`` of :mod:`~nemo_dist.conformance.moe.variants`; these two on
    the suite's own layer only.
    """
    out, aux, mine, want_out, want_aux, want_tokens = compared
    wanted = dict(reference.named_parameters())
    names, params = list(wanted), list(wanted.values())
    device = _device()
    values: dict[str, Any] = {
        "out": (_cpu(out), _cpu(want_out)),
        "aux": None if aux is None or want_aux is None else (_cpu(aux), _cpu(want_aux)),
        "tokens_grad": (_cpu(_grad_or_zeros(mine)), _cpu(_grad_or_zeros(want_tokens))),
        "grads": {n: (_cpu(_whole_grad(p, local.get(n))), _cpu(_grad_or_zeros(wanted[n])))
                  for n, p in layer.named_parameters() if n in wanted},
    }
    values["pairs"] = _cpu(pair_contributions(reference, xs[me].to(device)))
    own_loss = _loss(reference, xs[me], projections[me])[0]
    values["own_share"] = dict(zip(names, (_cpu(g) for g in _param_grads(own_loss, params)), strict=True))
    values["variants"] = {}
    experts = getattr(reference, "num_experts", None)
    held = _held_experts(layer, local, experts) if isinstance(experts, int) else None
    every = torch.cat(xs).to(device)
    for kind in VARIANTS:
        try:
            total = torch.zeros((), dtype=torch.float64, device=device)
            mine_again = xs[me].clone().to(device).requires_grad_(True)
            for r, x in enumerate(xs):
                tokens_r = mine_again if r == me else x.to(device)
                o, a = variant_forward(reference, tokens_r, kind, held or (), every)
                part = (o * projections[r].to(device)).sum() + AUX_WEIGHT * a
                total = total + part
                if r == me:
                    mine_out, mine_aux = o, a
            grads = _param_grads(total, [*params, mine_again])
        except ValueError:  # not the suite's layer: no variant to compare with
            break
        values["variants"][kind] = {
            "out": _cpu(mine_out), "aux": _cpu(mine_aux), "tokens_grad": _cpu(grads[-1]),
            "grads": dict(zip(names, (_cpu(g) for g in grads[:-1]), strict=True)),
        }
    return values


def _received_pairs(
    reference: nn.Module, layer: nn.Module, local: dict[str, LocalRows], xs: list[torch.Tensor]
) -> int | None:
    """How many (token, expert) pairs of every rank's tokens one process routes to the experts this rank holds."""
    experts = getattr(reference, "num_experts", None)
    routed = routed_experts(reference, torch.cat(xs).to(_device())) if isinstance(experts, int) else None
    held = _held_experts(layer, local, experts) if isinstance(experts, int) else None
    if routed is None or held is None:
        return None
    return int(torch.isin(routed.reshape(-1).cpu(), torch.tensor(held, dtype=torch.int64)).sum())


def _optimizer(kind: str, layer: nn.Module) -> torch.optim.Optimizer:
    """SGD, or Adam with eps 1e-3: Adam's first step moves each weight by lr * g / (|g| + eps), so with torch's eps
    (1e-8) a gradient entry near the rounding noise of a declared float32 computation would move by up to lr on one
    side and not the other, a false failure; 1e-3 bounds that to lr * noise / 1e-3."""
    if kind == "sgd":
        return torch.optim.SGD(layer.parameters(), lr=0.05)
    return torch.optim.Adam(layer.parameters(), lr=0.05, eps=1e-3)


def _train(
    layer: nn.Module, reference: nn.Module, xs: list[torch.Tensor], projections: list[torch.Tensor],
    steps: Sequence[tuple[str, int]], me: int, local: dict[str, LocalRows],
) -> dict[str, float | None]:
    """``steps`` (optimizer, count) on both, from the gradients of the backward already taken; what differs after."""
    for kind, count in steps:
        opt, ref_opt = _optimizer(kind, layer), _optimizer(kind, reference)
        for _ in range(count):
            _sum_plain_grads(layer, local)
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            # The tokens require grad, as a layer's input does in a model (it carries the earlier layers' gradient).
            _loss(layer, xs[me].clone().requires_grad_(True), projections[me])[0].backward()
            sum(_loss(reference, xs[r], projections[r])[0] for r in range(len(xs))).backward()  # type: ignore[union-attr]
    reference_params = dict(reference.named_parameters())
    return {name: _difference(_whole(p, local.get(name)), reference_params[name])
            for name, p in layer.named_parameters() if name in reference_params}


def placements(impl: Implementation) -> dict[str, Any]:
    """How the target lays the layer out on this rank: ``placements`` (each parameter's ``Shard(0)``, ``plain``...,
    or the error the target raised), ``held`` (the experts this rank holds, None where nothing says) and
    ``routing`` (``(num_experts, top_k)`` of a layer whose routing the suite can steer, else None)."""
    layer = build_layer(impl, 0).to(_device())
    experts = getattr(layer, "num_experts", None)
    routing = (layer.num_experts, layer.top_k) if steerable(layer) else None
    start = {name: p.detach().clone() for name, p in layer.named_parameters()}
    try:
        layer = parallelize(impl, layer, _mesh())
    except Exception as exc:  # reported by the checks, which run it again
        return {"placements": f"{type(exc).__name__}: {exc}", "held": None, "routing": routing}
    local = find(layer, start)[0]
    held = _held_experts(layer, local, experts) if isinstance(experts, int) else None
    return {"placements": _placements(layer, local), "held": held, "routing": routing}
