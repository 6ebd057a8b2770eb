"""Rank side of the moe checks: one layer under expert parallelism against one process, every difference reported.

Every rank builds the same seeded unsharded layer and every rank's seeded
tokens (counts uneven, a rank with none among them), so each computes the
one-process reference itself: the unsharded layer on each rank's tokens, the
loss summed over ranks (``sum(output * projection) + AUX_WEIGHT * aux``).
The expert-parallel copy runs on this rank's tokens only. The gradient of
this rank's tokens (what backpropagates to the layers before) is compared
with one process's gradient of the same tokens. Parameter gradients are
compared whole (:mod:`~nemo_dist.conformance.suites.moe.reading`). On the 1-D ep
mesh a plain parameter's gradient is this rank's share, and the suite sums
it over the world (the data-parallel reduction a training loop adds). Under
a composition (``--moe-mesh edp,ep``, a layout ``(edp, ep)``) the target
makes every reduction itself: each rank's loss is multiplied by the declared
scale, the declared after-backward step runs, and every gradient must be one
process's sum, divided by the data-parallel size under ``--moe-reduction
mean``. With tensor parallelism (``edp,ep,tp``) the ranks of a tensor-parallel
group share one batch (the tokens a TP block's input replicates), so the world
holds ``W / tp`` batches and one process sums the loss over those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.sharded import shards
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.gather.ranks import _device
from nemo_dist.conformance.suites.moe.evidence import diagnosis
from nemo_dist.conformance.suites.moe.local import LocalRows, find
from nemo_dist.conformance.suites.moe.messages import Probe, RunReport
from nemo_dist.conformance.suites.moe.reading import (
    chunks_match,
    difference,
    digest,
    full,
    grad_or_zeros,
    held_experts,
    layer_loss,
    placements_of,
    shard_digests,
    whole,
    whole_grad,
)
from nemo_dist.conformance.suites.moe.target import (
    Layout,
    after_backward,
    aux_weight,
    batches,
    build_layer,
    dim_of,
    loss_scale,
    mean_divisor,
    parallelize,
    routed_experts,
    steer,
    steerable,
    tp_size,
)

__all__ = ["placements", "run", "tokens"]

_MESHES: dict[tuple[str, int, Layout], Any] = {}


def _mesh(layout: Layout) -> Any:
    """The mesh the target is given: 1-D ``("ep",)`` over the world, or the layout's shape named ``("edp", "ep")``
    or ``("edp", "ep", "tp")`` (made once per world and layout: a mesh creates process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    device = _device().type
    key = (device, dist.get_world_size(), layout)
    if key not in _MESHES:
        shape, names = ((key[1],), ("ep",)) if layout is None else (layout, ("edp", "ep", "tp")[: len(layout)])
        _MESHES[key] = init_device_mesh(device, shape, mesh_dim_names=names)
    return _MESHES[key]


def tokens(seed: int, rank: int, count: int, dim: int, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s ``count`` seeded tokens (``salt`` 1: its output projection), float64."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + salt)
    return torch.randn(count, dim, generator=generator, dtype=torch.float64)


@dataclass(frozen=True)
class _Recipe:
    """How one run trains: the layout and its mesh, each rank's loss scale, what one process's sum is divided by
    for the expected gradients, and the target's own step after backward."""

    impl: Implementation
    layout: Layout
    mesh: Any
    scale: float
    divisor: float
    aux_weight: float

    @property
    def composed(self) -> bool:
        """Whether the target makes every reduction itself (a composition's layout)."""
        return self.layout is not None

    def backward(self, layer: nn.Module, loss: torch.Tensor) -> None:
        """Backpropagate this rank's scaled loss, then the declared step after backward."""
        (loss * self.scale if self.scale != 1 else loss).backward()
        if self.composed:
            after_backward(self.impl, layer, self.mesh)

    def reduce_plain(self, layer: nn.Module, local: dict[str, LocalRows]) -> None:
        """On the 1-D mesh, sum the replicated (plain, not rank-local) parameters' gradients over the world, as data
        parallelism would; a composition's target has made its reductions."""
        if self.composed:
            return
        for name, param in layer.named_parameters():
            if not isinstance(param, DTensor) and name not in local and param.grad is not None:
                dist.all_reduce(param.grad)

    def loss(self, layer: nn.Module, x: torch.Tensor, projection: torch.Tensor) -> tuple[torch.Tensor, Any, Any]:
        """:func:`~.reading.layer_loss` with the declared auxiliary loss weight."""
        return layer_loss(layer, x, projection, self.aux_weight)

    def reference_backward(self, reference: nn.Module, xs: Sequence[torch.Tensor],
                           projections: Sequence[torch.Tensor]) -> list[tuple[Any, Any]]:
        """One process's backward of the loss summed over the batches ``xs`` (each a leaf where its gradient is
        wanted); each batch's ``(output, aux_loss)``.

        An auxiliary loss the layer returns is weighted in the loss itself. One it injects into backward (a hook
        whose gradient does not depend on the loss's, as upstream's ``MoEAuxLossAutoScaler``) is found by a first
        backward of the loss times zero and weighted afterwards; with weight 1 nothing is run twice."""
        injected: list[torch.Tensor | None] = []
        params = list(reference.parameters())
        if self.aux_weight != 1:
            again = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
            losses = [self.loss(reference, x, p)[0] for x, p in zip(again, projections, strict=True)]
            zero = torch.stack(losses).sum() * 0
            leaves = [*params, *(x for x in again if x.requires_grad)]
            injected = list(torch.autograd.grad(zero, leaves, allow_unused=True)) if zero.requires_grad else []
        found: list[tuple[Any, Any]] = []
        total = torch.zeros((), dtype=torch.float64, device=_device())
        for x, p in zip(xs, projections, strict=True):
            part, out, aux = self.loss(reference, x, p)
            total, found = total + part, [*found, (out, aux)]
        total.backward()
        with torch.no_grad():
            for leaf, extra in zip([*params, *(x for x in xs if x.requires_grad)], injected, strict=False):
                if extra is not None and leaf.grad is not None:
                    leaf.grad.add_(extra, alpha=self.aux_weight - 1)
        return found

    def expected(self, reference: nn.Module) -> None:
        """Divide one process's summed gradients as the declared reduction does (the loss's scale is the target's
        after-backward step's to undo)."""
        if self.divisor != 1:
            for param in reference.parameters():
                if param.grad is not None:
                    param.grad.div_(self.divisor)


def run(
    impl: Implementation, counts: Sequence[int], seed: int, steps: Sequence[tuple[str, int]], muted: Sequence[int] = (),
    diagnose: bool = False, layout: Layout = None,
) -> RunReport:
    """One example: forward, backward and ``steps`` of the expert-parallel layer and of one process; what differs.

    ``counts[b]`` tokens in batch b, the batch of rank b (of the ranks ``b * tp ...`` under tensor parallelism);
    ``muted`` experts the router is steered away from (:func:`~.target.steer`), so that chosen ranks receive no
    (token, expert) pair; ``layout`` a composition's (None: the 1-D ep mesh). The target's errors are not caught:
    a rank that raises shows its exception (the harness reports every rank's), and the ranks it leaves waiting are
    reported stuck, not hung. ``received_pairs`` is how many pairs one
    process routes to the experts this rank holds (None where the layer's routing or placement cannot be read).
    With ``diagnose``, ``values`` holds what was compared and what one process gives with each known bug built in
    (:func:`~.evidence.diagnosis`).
    """
    size = dist.get_world_size()
    batch = dist.get_rank() // tp_size(layout)  # the batch this rank holds
    assert len(counts) == batches(layout, size), "a count per batch"
    mesh = _mesh(layout)
    recipe = _Recipe(impl, layout, mesh, loss_scale(impl, layout, size), mean_divisor(impl, layout, size),
                     aux_weight(impl, layout, size))
    reference = build_layer(impl, seed).to(_device())
    if muted:
        steer(reference, muted)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    layer = parallelize(impl, fresh_copy(reference), mesh)
    dim = dim_of(reference)
    xs = [tokens(seed, r, n, dim) for r, n in enumerate(counts)]
    projections = [tokens(seed, r, n, dim, salt=1) for r, n in enumerate(counts)]
    local, found_problems = find(layer, before, replicas=_replicas(layout))
    placed, chunks_wrong = placements_of(layer, local), chunks_match(layer)
    received = _received_pairs(reference, layer, local, xs)
    start = {name: difference(whole(p, local.get(name)), before[name]) for name, p in layer.named_parameters()
             if name in before}
    mine = xs[batch].clone().requires_grad_(True)
    loss, out, aux = recipe.loss(layer, mine, projections[batch])
    recipe.backward(layer, loss)
    theirs = [x.clone().requires_grad_(True) for x in xs]
    want_out, want_aux = recipe.reference_backward(reference, theirs, projections)[batch]
    recipe.expected(reference)
    # A rank's tokens' gradient is never reduced: it carries the loss's scale and nothing else.
    want_tokens = grad_or_zeros(theirs[batch]) * recipe.scale
    tokens_grad = difference(grad_or_zeros(mine), want_tokens)
    out_off = difference(full(out), want_out)
    aux_off = None if aux is None or want_aux is None else difference(full(aux), want_aux)
    wanted = dict(reference.named_parameters())
    grads = {name: (whole_grad(p, local.get(name), summed=not recipe.composed), grad_or_zeros(wanted[name]))
             for name, p in layer.named_parameters() if name in wanted}
    values = None
    if diagnose:
        values = diagnosis(reference, layer, local, xs, projections, batch,
                           (out, aux, mine, want_out, want_aux, want_tokens, grads), divisor=recipe.divisor,
                           aux_weight=recipe.aux_weight)
        values["aux_parts"] = _aux_parts(recipe, reference, xs, projections, batch)
        values["torch_divide"] = _torch_divide(layer, recipe)
    stepped = _train(layer, reference, xs, projections, steps, batch, local, recipe)
    replicated = {
        name: digest(p.to_local() if isinstance(p, DTensor) else p) for name, p in layer.named_parameters()
        if name not in local and (not isinstance(p, DTensor) or not any(shards(pl) for pl in p.placements))
    }
    return RunReport(
        placements=placed, chunks_wrong=chunks_wrong, local_problems=found_problems, received_pairs=received,
        start=start, tokens_grad=tokens_grad, out=out_off, aux=aux_off, has_aux=aux is not None,
        grads={name: difference(got, want) for name, (got, want) in grads.items()}, steps=stepped,
        replicated_digests=replicated, shard_digests=shard_digests(layer, local), values=values,
    )


def _aux_parts(
    recipe: _Recipe, reference: nn.Module, xs: list[torch.Tensor], projections: list[torch.Tensor], batch: int
) -> dict[str, Any] | None:
    """One process's expected gradients split in two, on CPU: ``main`` without the auxiliary loss and ``aux`` the
    auxiliary loss's alone at weight 1 (each ``{"grads": by name, "tokens_grad": this batch's}``), so that any
    weight of it can be tried; None on the 1-D mesh (the suite builds every rank's loss there)."""
    if recipe.layout is None:
        return None
    parts: list[dict[str, Any]] = []
    for weight in (0.0, 1.0):
        again = fresh_copy(reference)
        again.zero_grad(set_to_none=True)
        theirs = [x.clone().requires_grad_(True) for x in xs]
        dataclasses.replace(recipe, aux_weight=weight).reference_backward(again, theirs, projections)
        recipe.expected(again)
        parts.append({"grads": {name: grad_or_zeros(p).detach().double().cpu() for name, p in again.named_parameters()},
                      "tokens_grad": (grad_or_zeros(theirs[batch]) * recipe.scale).detach().double().cpu()})
    main, total = parts
    aux = {"grads": {name: total["grads"][name] - g for name, g in main["grads"].items()},
           "tokens_grad": total["tokens_grad"] - main["tokens_grad"]}
    return {"main": main, "aux": aux}


def _torch_divide(layer: nn.Module, recipe: _Recipe) -> dict[str, Any] | None:
    """Where the target's FSDP2 modules state one gradient divide factor, a shard group has one rank and the layer
    is float64 or float16 (what torch 2.13 divides twice): the factor, the dtype and what ``fully_shard`` alone
    gives over this world with one-rank shard groups (:func:`~nemo_dist.conformance.suites.wrapper.torch_faults.probe`,
    run on every rank alike); else None."""
    from nemo_dist.conformance.suites.wrapper.torch_faults import divide_factor_state, probe

    state = divide_factor_state(layer)
    dtype = str(next(layer.parameters()).dtype).removeprefix("torch.")
    wanted = len(state["factors"]) == 1 and state["min_shard"] == 1 and dtype in ("float64", "float16")
    agreed = torch.tensor([int(recipe.composed and wanted)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # every rank probes, or none does
    if not int(agreed):
        return None
    factor = state["factors"][0]
    return {"factor": factor, "dtype": dtype, **probe((dist.get_world_size(), 1), factor)}


def _replicas(layout: Layout) -> int:
    """How many ranks hold each expert in ``layout``: its edp times its tp (1 on the 1-D mesh)."""
    return 1 if layout is None else layout[0] * tp_size(layout)


def _received_pairs(
    reference: nn.Module, layer: nn.Module, local: dict[str, LocalRows], xs: list[torch.Tensor]
) -> int | None:
    """How many (token, expert) pairs of every rank's tokens one process routes to the experts this rank holds."""
    experts = getattr(reference, "num_experts", None)
    routed = routed_experts(reference, torch.cat(xs).to(_device())) if isinstance(experts, int) else None
    held = held_experts(layer, local, experts) if isinstance(experts, int) else None
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
    steps: Sequence[tuple[str, int]], batch: int, local: dict[str, LocalRows], recipe: _Recipe,
) -> dict[str, float | None]:
    """``steps`` (optimizer, count) on both, from the gradients of the backward already taken; what differs after."""
    for kind, count in steps:
        opt, ref_opt = _optimizer(kind, layer), _optimizer(kind, reference)
        for _ in range(count):
            recipe.reduce_plain(layer, local)
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            # The tokens require grad, as a layer's input does in a model (it carries the earlier layers' gradient).
            recipe.backward(layer, recipe.loss(layer, xs[batch].clone().requires_grad_(True), projections[batch])[0])
            recipe.reference_backward(reference, xs, projections)
            recipe.expected(reference)
    reference_params = dict(reference.named_parameters())
    return {name: difference(whole(p, local.get(name)), reference_params[name])
            for name, p in layer.named_parameters() if name in reference_params}


def placements(impl: Implementation, layout: Layout = None) -> Probe:
    """How the target lays the layer out on this rank, before any forward (:class:`~.messages.Probe`)."""
    layer = build_layer(impl, 0).to(_device())
    experts = getattr(layer, "num_experts", None)
    routing = (int(getattr(layer, "num_experts")), int(getattr(layer, "top_k"))) if steerable(layer) else None  # noqa: B009
    start = {name: p.detach().clone() for name, p in layer.named_parameters()}
    try:
        layer = parallelize(impl, layer, _mesh(layout))
    except Exception as exc:  # reported by the checks, which run it again
        return Probe(placements=f"{type(exc).__name__}: {exc}", held=None, routing=routing)
    local, problems = find(layer, start, replicas=_replicas(layout))
    held = held_experts(layer, local, experts) if isinstance(experts, int) else None
    return Probe(
        placements=placements_of(layer, local), held=held, routing=routing, chunks_wrong=chunks_match(layer),
        local_problems=problems,
        start={name: difference(whole(p, local.get(name)), start[name]) for name, p in layer.named_parameters()
               if name in start},
    )
