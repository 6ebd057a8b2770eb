"""One process's layer with one known bug built in: the isolating comparisons the moe suite's causes rest on.

A failing check re-runs its scenario with ``diagnose``
(:func:`~nemo_dist.conformance.suites.moe.ranks.run`), and each rank computes, on
the suite's own :class:`~nemo_dist.conformance.suites.moe.layer.TinyMoE`, what one
process would give if it had that bug: where the expert-parallel layer
matches one of these exactly (and not the right answer), that bug is proven
to be its difference. The variants:

- ``weights_twice``: the routing weights applied twice (the output weighted
  by their square);
- ``weights_detached``: the routing weights outside autograd (the router
  learns only from the auxiliary loss);
- ``dispatch_detached``: the tokens sent to the experts outside autograd
  (their gradient has only the router's part);
- ``own_experts_only``: each rank's tokens get the experts' part of their
  gradient only from the experts that rank holds (a gather whose backward
  keeps this rank's slice of its own gradient, never summed);
- ``aux_over_all_tokens``: the load-balance loss taken over every rank's
  tokens instead of this rank's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from nemo_dist.conformance.suites.moe.layer import TinyMoE, expert_outputs

__all__ = ["VARIANTS", "every_expert", "pair_contributions", "variant_forward"]

VARIANTS = ("weights_twice", "weights_detached", "dispatch_detached", "own_experts_only", "aux_over_all_tokens")


def variant_forward(
    layer: nn.Module, tokens: torch.Tensor, kind: str, held: Sequence[int] = (), every: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, aux_loss)`` of ``layer`` (a :class:`TinyMoE`) on ``tokens`` with bug ``kind`` built in.

    ``held``: the experts of the rank whose tokens these are (``own_experts_only``); ``every``: every rank's tokens
    (``aux_over_all_tokens``). Raises ``ValueError`` for another layer or kind.
    """
    if not isinstance(layer, TinyMoE) or kind not in VARIANTS:
        raise ValueError(f"no variant {kind!r} of {type(layer).__name__}")
    scores, indices, weights = layer.route(tokens)
    if kind == "weights_twice":
        weights = weights * weights
    elif kind == "weights_detached":
        weights = weights.detach()
    k = indices.shape[1]
    pairs = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(k)
    experts = indices.reshape(-1)
    rows = tokens[pairs]
    if kind == "dispatch_detached":
        rows = rows.detach()
    elif kind == "own_experts_only":
        mine = torch.isin(experts, torch.tensor(list(held), dtype=experts.dtype, device=experts.device))
        rows = torch.where(mine.reshape(-1, 1), rows, rows.detach())
    out = expert_outputs(rows, experts, layer.experts.w1, layer.experts.w2)
    out = tokens.new_zeros(tokens.shape).index_add(0, pairs, out * weights.reshape(-1, 1))
    if kind == "aux_over_all_tokens" and every is not None:
        scores, indices, _ = layer.route(every)
    return out, layer.load_balance_loss(scores, indices)


def every_expert(layer: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """For a :class:`TinyMoE`: ``outputs`` ``[T, E, dim]`` (each token through every expert, unweighted), and the
    routing one process gives: ``indices`` and ``weights`` ``[T, top_k]``; None for any other layer."""
    if not isinstance(layer, TinyMoE):
        return None
    with torch.no_grad():
        _, indices, weights = layer.route(tokens)
        w1, w2 = layer.experts.w1, layer.experts.w2
        outputs = torch.stack([torch.nn.functional.silu(tokens @ w1[e]) @ w2[e] for e in range(w1.shape[0])], dim=1)
        return {"outputs": outputs, "indices": indices, "weights": weights}


def pair_contributions(every: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
    """``[T, top_k, dim]``: what each (token, expert) pair adds to one process's output (its expert's output times
    its routing weight), read from :func:`every_expert`'s result; None where that is None."""
    if every is None:
        return None
    outputs, indices, weights = every["outputs"], every["indices"], every["weights"]
    chosen = outputs.gather(1, indices.unsqueeze(-1).expand(-1, -1, outputs.shape[-1]))
    return chosen * weights.unsqueeze(-1)
