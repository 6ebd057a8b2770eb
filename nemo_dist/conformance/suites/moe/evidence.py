"""Rank side of a failing moe scenario's diagnosis: what was compared, whole, and one process given known bugs.

Run only when a check failed (:func:`~nemo_dist.conformance.suites.moe.ranks.run`
with ``diagnose``); :mod:`~nemo_dist.conformance.suites.moe.causes` reads it in the
parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from nemo_dist.conformance.suites.gather.ranks import _device
from nemo_dist.conformance.suites.moe.local import LocalRows
from nemo_dist.conformance.suites.moe.reading import full, grad_or_zeros, held_experts, layer_loss, loss_of
from nemo_dist.conformance.suites.moe.variants import VARIANTS, every_expert, pair_contributions, variant_forward

__all__ = ["diagnosis"]


def _cpu(tensor: Any) -> torch.Tensor | None:
    return None if tensor is None else full(tensor).detach().double().cpu().clone()


def _param_grads(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient of ``loss`` for each of ``params`` (zeros where it does not reach one), outside ``.grad``."""
    found = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else [None] * len(params)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, found, strict=True)]


def diagnosis(
    reference: nn.Module, layer: nn.Module, local: dict[str, LocalRows], xs: list[torch.Tensor],
    projections: list[torch.Tensor], me: int, compared: tuple[Any, ...], *, divisor: float = 1.0,
    aux_weight: float = 1.0,
) -> dict[str, Any]:
    """What the checks compared, whole, on CPU, and what one process gives with each known bug built in.

    ``compared``: the run's ``(out, aux, tokens, want_out, want_aux, want_tokens, grads)``, ``grads`` each
    parameter's ``(whole gradient, one process's)`` as the run read them; ``divisor``: what one process's summed
    gradients are divided by for the expected ones (a declared mean); ``aux_weight``: what a returned auxiliary loss
    counts (a declared aux mean).

    ``out``, ``aux``, ``tokens_grad``: ``(got, want)`` for this rank; ``grads``: ``{name: (got, want)}`` whole;
    ``own_share``: each parameter's gradient from this rank's tokens alone (what a gradient never summed over ranks
    is); ``pairs``: what each of this rank's (token, expert) pairs adds to one process's output; ``every_expert``:
    each of its tokens through every expert, with one process's routing; ``variants``:
    ``{kind: {"out", "aux", "tokens_grad", "grads"}}`` of :mod:`.variants`; these two on
    the suite's own layer only.
    """
    out, aux, mine, want_out, want_aux, want_tokens, grads = compared
    wanted = dict(reference.named_parameters())
    names, params = list(wanted), list(wanted.values())
    device = _device()
    values: dict[str, Any] = {
        "out": (_cpu(out), _cpu(want_out)),
        "aux": None if aux is None or want_aux is None else (_cpu(aux), _cpu(want_aux)),
        "tokens_grad": (_cpu(grad_or_zeros(mine)), _cpu(want_tokens)),
        "grads": {n: (_cpu(got), _cpu(want)) for n, (got, want) in grads.items()},
        "aux_weight": aux_weight,
    }
    found = every_expert(reference, xs[me].to(device))
    values["pairs"] = _cpu(pair_contributions(found))
    values["every_expert"] = None if found is None else {k: _cpu(v) for k, v in found.items()}
    own_loss = layer_loss(reference, xs[me], projections[me], aux_weight)[0]
    values["own_share"] = dict(zip(names, (_cpu(g / divisor) for g in _param_grads(own_loss, params)), strict=True))
    values["variants"] = {}
    experts = getattr(reference, "num_experts", None)
    held = held_experts(layer, local, experts) if isinstance(experts, int) else None
    every = torch.cat(xs).to(device)
    for kind in VARIANTS:
        try:
            total = torch.zeros((), dtype=torch.float64, device=device)
            mine_again = xs[me].clone().to(device).requires_grad_(True)
            for r, x in enumerate(xs):
                tokens_r = mine_again if r == me else x.to(device)
                o, a = variant_forward(reference, tokens_r, kind, held or (), every)
                total = total + loss_of(o, a, projections[r], aux_weight)
                if r == me:
                    mine_out, mine_aux = o, a
            grads = _param_grads(total, [*params, mine_again])
        except ValueError:  # not the suite's layer: no variant to compare with
            break
        values["variants"][kind] = {
            "out": _cpu(mine_out), "aux": _cpu(mine_aux), "tokens_grad": _cpu(grads[-1]),
            "grads": dict(zip(names, (_cpu(g / divisor) for g in grads[:-1]), strict=True)),
        }
    return values


