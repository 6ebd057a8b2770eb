"""The likely causes of the moe checks' failures, each named only where a comparison proves it.

A failing scenario is re-run with ``diagnose``
(:func:`~nemo_dist.conformance.suites.moe.ranks.run`): every rank sends what was
compared, whole, and what one process gives with each known bug built in
(:mod:`~nemo_dist.conformance.suites.moe.variants`). A cause is named when the
expert-parallel layer's values match one of those exactly where they do not
match the right ones, when a difference is an exact factor of the right
value, or when every difference lies within a lower dtype's rounding. Where
nothing matches, no cause is printed: the failure says which tensor is off,
by how much, on which ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_dist.conformance.suites.moe.target import dtype_tolerance

__all__ = [
    "AUX_OVER_ALL_TOKENS",
    "AUX_WEIGHTED",
    "DISPATCH_DETACHED",
    "DROPPED_PAIRS",
    "FACTOR",
    "NOT_SUMMED_OVER_TP",
    "OWN_EXPERTS_ONLY",
    "REDUCED_OVER_SHARDS",
    "ROUNDING",
    "UNREDUCED",
    "WEIGHTS_DETACHED",
    "WEIGHTS_TWICE",
    "WRONG_EXPERTS",
    "forward_cause",
    "gradient_cause",
    "relative",
    "rounding_cause",
]

ROUNDING = (
    "every difference (at most {largest:.3g}) is within {dtype}'s rounding ({allowed:.3g}): the layer computes, "
    "gathers or adds up in {dtype} somewhere while its parameters are {declared}; if it does so by design, declare "
    "--moe-compute-dtype {dtype} (under pytest --conformance-moe-compute-dtype {dtype})"
)
FACTOR = "{what} exactly {factor:.6g} times one process's on every rank{implied}"
WEIGHTS_TWICE = (
    "the routing weights are applied twice: every rank's output equals one process's with each expert's output "
    "weighted by the square of its routing weight"
)
AUX_OVER_ALL_TOKENS = (
    "the load-balance loss is taken over every rank's tokens: each rank's auxiliary loss equals one process's over "
    "the whole batch, where one process on this rank's tokens takes it over those"
)
WEIGHTS_DETACHED = (
    "the routing weights reach the output outside autograd: every wrong gradient equals one process's with the "
    "routing weights detached (the router learns only from the auxiliary loss)"
)
UNREDUCED = (
    "{names} never summed over the ranks: each rank's gradient is its own tokens' share alone (a Partial gradient "
    "marked Replicate, or a replicated parameter left out of the data-parallel reduction)"
)
NOT_SUMMED_OVER_TP = (
    "{names} not summed over the tensor-parallel group: the ranks of a tp group, which share one batch and hold "
    "the same replica, get different gradients (ranks {ranks}), so part of each is computed on one tp rank and "
    "never all-reduced over tp, and the replicas drift apart"
)
REDUCED_OVER_SHARDS = (
    "{names} summed over ranks that hold different experts: each rank's shard of the gradient is the sum of every "
    "rank's shard (an all-reduce over the expert-parallel group, as if its ranks were data-parallel replicas)"
)
DISPATCH_DETACHED = (
    "the tokens reach the experts outside autograd: each rank's tokens' gradient equals one process's with the "
    "dispatched tokens detached (only the router's part), while every parameter's gradient is right"
)
OWN_EXPERTS_ONLY = (
    "each rank's tokens get the experts' part of their gradient only from the experts that rank holds: the gather "
    "that brings tokens to the experts keeps this rank's slice of its own gradient (full_tensor()'s backward, "
    "Replicate to Shard) where every rank's gradient of those rows must be summed first (a reduce-scatter)"
)

AUX_WEIGHTED = (
    "each rank's auxiliary loss counts {found:.6g} of its other loss{implied}, where --moe-aux-reduction {declared} "
    "declares {weight:.6g}: every gradient equals one process's with that weight{advice}"
)
#: What an auxiliary loss's weight of one over a named size means.
_AUX_SIZE_WORDS = {"W": "averaged over the world", "dp": "averaged over the data-parallel ranks",
                   "ep": "averaged over the expert-parallel group", "edp": "averaged over each expert's replicas",
                   "tp": "averaged over the tensor-parallel group"}

WRONG_EXPERTS = (
    "(token, expert) pairs computed by other experts: every token's output is one process's with each pair's "
    "expert replaced, the same way on every rank ({mapping}: routed to -> computed by), so the dispatch sends a "
    "pair to a rank, or a local index, that holds another expert"
)

DROPPED_PAIRS = (
    "(token, expert) pairs dropped: every token's output is one process's sum over a subset of its pairs, and "
    "{count} pair(s) are missing (ranks {ranks}; a capacity limit, or a dispatch that loses them)"
)

#: Lower dtypes a float64 difference may be the rounding of, most precise first, and how many roundings of each
#: name it: float32's are six orders below any bug measured here; bfloat16's and float16's unit roundoffs are
#: large, so only a few of them are taken as evidence.
_LOWER = (("float32", None), ("bfloat16", 4), ("float16", 4))

#: Variant (of :mod:`.variants`) -> the cause it proves where it explains every compared
#: tensor of a check.
_VARIANT_CAUSES = {
    "weights_twice": WEIGHTS_TWICE,
    "weights_detached": WEIGHTS_DETACHED,
    "dispatch_detached": DISPATCH_DETACHED,
    "own_experts_only": OWN_EXPERTS_ONLY,
    "aux_over_all_tokens": AUX_OVER_ALL_TOKENS,
}

Compared = list[tuple[str, torch.Tensor | None, torch.Tensor | None]]


def relative(got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    """max |got - want| relative to max(1, max |want|); inf where either is missing or the shapes differ."""
    if got is None or want is None or got.shape != want.shape:
        return float("inf")
    if not want.numel():
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def rounding_cause(largest: float, allowed: float, declared: str = "float64") -> str:
    """:data:`ROUNDING` for the most precise lower dtype whose rounding holds ``largest`` (a difference above the
    ``allowed`` tolerance), or "" where none does or the tolerance already allows that dtype."""
    from nemo_dist.conformance.suites.ddp.expectations import unit_roundoff

    for dtype, roundings in _LOWER:
        bound = dtype_tolerance(dtype) if roundings is None else roundings * unit_roundoff(getattr(torch, dtype))
        if allowed < bound and largest <= bound:
            return ROUNDING.format(largest=largest, allowed=bound, dtype=dtype, declared=declared)
    return ""


def _compared(values: dict[str, Any], kind: str) -> Compared:
    """What check ``kind`` ("forward" or "gradients") compares on one rank: ``(name, got, want)``."""
    if kind == "forward":
        found: Compared = [("output", *values["out"])]
        return found + ([("aux loss", *values["aux"])] if values["aux"] is not None else [])
    return [*((n, g, w) for n, (g, w) in values["grads"].items()), ("tokens", *values["tokens_grad"])]


def _variant_value(variant: dict[str, Any], name: str) -> torch.Tensor | None:
    """The variant's value of compared tensor ``name``."""
    if name == "output":
        return variant["out"]
    if name == "aux loss":
        return variant["aux"]
    if name == "tokens":
        return variant["tokens_grad"]
    found: torch.Tensor | None = variant["grads"].get(name)
    return found


def _explained(values: Sequence[dict[str, Any]], kind: str, allowed: float) -> str | None:
    """The cause of the one variant that every rank's compared tensors equal (while some differ from one
    process's); "" where none does, None where several do (this scenario cannot tell them apart)."""
    found = []
    for variant, cause in _VARIANT_CAUSES.items():
        explains, wrong = True, False
        for v in values:
            built = v.get("variants", {}).get(variant)
            if built is None:
                return ""
            for name, got, want in _compared(v, kind):
                explains = explains and relative(got, _variant_value(built, name)) <= allowed
                wrong = wrong or relative(got, want) > allowed
        if explains and wrong:
            found.append(cause)
    return found[0] if len(found) == 1 else (None if found else "")


def _factor(pairs: Sequence[tuple[torch.Tensor | None, torch.Tensor | None]], allowed: float) -> float | None:
    """The one factor f with every ``got`` equal to ``f * want`` within ``allowed`` (f not 1), else None."""
    if not pairs or any(g is None or w is None or g.shape != w.shape for g, w in pairs):
        return None
    wanted = torch.cat([w.flatten() for _, w in pairs])  # type: ignore[union-attr]
    got = torch.cat([g.flatten() for g, _ in pairs])  # type: ignore[union-attr]
    norm = float((wanted * wanted).sum())
    if not norm:
        return None
    factor = float((got * wanted).sum()) / norm
    if abs(factor - 1) <= 1e-6 or abs(factor) <= 1e-9:
        return None
    return factor if all(relative(g, None if w is None else factor * w) <= allowed for g, w in pairs) else None


#: What each named size is, for a factor's words.
_SIZE_WORDS = {"W": "the world, the data-parallel size", "ep": "the expert-parallel size",
               "edp": "the expert-data-parallel size, each expert's replicas",
               "tp": "the tensor-parallel size, the ranks that share a batch", "dp": "the data-parallel size"}


def _implied(factor: float, sizes: dict[str, int]) -> str:
    """The sizes an exact factor implies (``x ep``, ``/ W``...), where it is one of them or its inverse."""
    for inverse, sign, what in ((False, "x", "summed where one process counts once"),
                                (True, "/", "divided once more than one process")):
        names = [n for n, v in sizes.items() if v > 1 and abs((1 / factor if inverse else factor) - v) <= 1e-6 * v]
        if names:
            named = " = ".join(names) + f" = {sizes[names[0]]}"
            words = [_SIZE_WORDS[n] if n != "W" or "dp" not in sizes else "the world" for n in names]
            return f" ({sign} {named}: {'; '.join(words)}; {what})"
    return ""


def _scaled(values: Sequence[dict[str, Any]], kind: str, allowed: float, sizes: dict[str, int]) -> str:
    """:data:`FACTOR` where every wrong compared tensor is one exact factor of one process's on every rank."""
    wrong = sorted({n for v in values for n, g, w in _compared(v, kind) if relative(g, w) > allowed})
    pairs = [(g, w) for v in values for n, g, w in _compared(v, kind) if n in wrong]
    factor = _factor(pairs, allowed)
    if factor is None:
        return ""
    what = ("the gradients of " if kind == "gradients" else "the ") + ", ".join(wrong) + (
        " are" if len(wrong) > 1 or kind == "gradients" else " is")
    return FACTOR.format(what=what, factor=factor, implied=_implied(factor, sizes))


def _rounded(values: Sequence[dict[str, Any]], kind: str, allowed: float) -> str:
    largest = max((relative(g, w) for v in values for _, g, w in _compared(v, kind)), default=0.0)
    return rounding_cause(largest, allowed) if largest > allowed else ""


def _dropped_pairs(values: Sequence[dict[str, Any]], allowed: float) -> str:
    """:data:`DROPPED_PAIRS` where every token's output is one process's sum over a subset of its (token, expert)
    pairs' contributions and some subset is not whole (the suite's own layer only)."""
    missing, ranks = 0, list[int]()
    for rank, v in enumerate(values):
        contributions, (got, _want) = v.get("pairs"), v["out"]
        if contributions is None or got is None or got.shape[0] != contributions.shape[0]:
            return ""
        k = contributions.shape[1]
        subsets = [[bool(mask >> j & 1) for j in range(k)] for mask in range(2**k)]
        for token in range(got.shape[0]):
            sums = [(sum(keep), contributions[token][torch.tensor(keep)].sum(dim=0)) for keep in subsets]
            kept = [n for n, total in sums if relative(got[token], total) <= allowed]
            if not kept:
                return ""
            if max(kept) < k:
                missing += k - max(kept)
                ranks = ranks if rank in ranks else [*ranks, rank]
    return DROPPED_PAIRS.format(count=missing, ranks=", ".join(map(str, ranks))) if missing else ""


def _wrong_experts(values: Sequence[dict[str, Any]], allowed: float) -> str:
    """:data:`WRONG_EXPERTS` where every token's output on every rank is its routing weights times the outputs of
    one replacement expert per routed expert, the replacement one function of the routed expert across all tokens
    and ranks, and not the identity (the suite's own layer only)."""
    mapping: dict[int, int] = {}
    for v in values:
        every, (got, _want) = v.get("every_expert"), v["out"]
        if every is None or got is None:
            return ""
        outputs, indices, weights = every["outputs"], every["indices"], every["weights"]
        experts, k = outputs.shape[1], indices.shape[1]
        combos = torch.cartesian_prod(*[torch.arange(experts)] * k).reshape(-1, k)  # every choice of k experts
        for token in range(got.shape[0]):
            candidates = (weights[token].reshape(1, k, 1) * outputs[token][combos]).sum(dim=1)  # [C, dim]
            scale = max(1.0, float(got[token].abs().max()))
            off = (candidates - got[token]).abs().amax(dim=1) / scale
            matches = torch.nonzero(off <= allowed).reshape(-1)
            if len(matches) != 1:
                return ""
            for routed, computed in zip(indices[token].long().tolist(), combos[matches[0]].tolist(), strict=True):
                if mapping.setdefault(routed, computed) != computed:
                    return ""
    moved = {e: c for e, c in sorted(mapping.items()) if e != c}
    if not moved:
        return ""
    return WRONG_EXPERTS.format(mapping=", ".join(f"{e} -> {c}" for e, c in moved.items()))


def forward_cause(values: Sequence[dict[str, Any]], allowed: float, sizes: dict[str, int]) -> str | None:
    """The proven cause of wrong outputs or auxiliary losses across the ranks' diagnosis ``values`` ("" if none,
    None where the scenario fits several)."""
    explained = _explained(values, "forward", allowed)
    if explained is None:
        return None
    return (explained or _dropped_pairs(values, allowed) or _wrong_experts(values, allowed)
            or _scaled(values, "forward", allowed, sizes) or _rounded(values, "forward", allowed))


def gradient_cause(values: Sequence[dict[str, Any]], allowed: float, sizes: dict[str, int]) -> str | None:
    """The proven cause of wrong parameter or token gradients across the ranks' diagnosis ``values`` ("" if none,
    None where the scenario fits several).

    Also the cause of wrong parameters after steps: a step follows from its gradients, so where they are right
    nothing is proven here."""
    found = _explained(values, "gradients", allowed)
    if found is None or found:
        return found
    if any(relative(*v["out"]) > allowed for v in values):  # gradients of a wrong forward: its proven cause
        found = _wrong_experts(values, allowed) or _dropped_pairs(values, allowed)
        if found:
            return found
    found = _aux_weighted(values, allowed, sizes) or _torch_double_divide(values, allowed)
    if found:
        return found
    first = values[0]
    wrong = sorted({n for v in values for n, (g, w) in v["grads"].items() if relative(g, w) > allowed})
    if wrong and all(relative(v["grads"][n][0], v["own_share"].get(n)) <= allowed for v in values for n in wrong):
        return UNREDUCED.format(names=", ".join(wrong))
    split = _differs_over_tp(values, wrong, sizes.get("tp", 1), allowed)
    if split:
        ranks = min(split.values())  # the first tp group where any of them differs
        return NOT_SUMMED_OVER_TP.format(names=", ".join(split), ranks=", ".join(map(str, ranks)))
    shards = sizes.get("ep", sizes["W"])
    if wrong and all(_summed_over_shards(first["grads"][n][0], first["grads"][n][1], shards, allowed) for n in wrong):
        return REDUCED_OVER_SHARDS.format(names=", ".join(wrong))
    return _scaled(values, "gradients", allowed, sizes) or _rounded(values, "gradients", allowed)


def _aux_weighted(values: Sequence[dict[str, Any]], allowed: float, sizes: dict[str, int]) -> str:
    """:data:`AUX_WEIGHTED` where one weight w, not the declared one, gives every rank's compared gradients
    (parameters and tokens) as one process's ``main + w * aux`` (the diagnosis's ``aux_parts``)."""
    parts: list[dict[str, Any]] = [v["aux_parts"] for v in values if v.get("aux_parts") is not None]
    if not values or len(parts) != len(values):
        return ""
    rows = [(got, p["main"]["tokens_grad"] if name == "tokens" else p["main"]["grads"].get(name),
             p["aux"]["tokens_grad"] if name == "tokens" else p["aux"]["grads"].get(name))
            for v, p in zip(values, parts, strict=True) for name, got, _ in _compared(v, "gradients")]
    if any(g is None or m is None or a is None or g.shape != m.shape for g, m, a in rows):
        return ""
    norm = sum(float((a * a).sum()) for _, _, a in rows)
    if not norm:
        return ""
    weight = sum(float(((g - m) * a).sum()) for g, m, a in rows) / norm
    declared = values[0].get("aux_weight", 1.0)
    if abs(weight - declared) <= 1e-6 * max(1.0, abs(declared)) or any(
        relative(g, m + weight * a) > allowed for g, m, a in rows
    ):
        return ""
    sizes = {"dp": sizes["W"], **sizes}  # without tp the data-parallel ranks are the world
    dp = sizes["dp"]
    named = [n for n in ("dp", "W", "ep", "edp", "tp") if n in sizes and sizes[n] > 1
             and abs(weight * sizes[n] - 1) <= 1e-6]
    implied = f" (1 / {' = '.join(named)} = {sizes[named[0]]}: {_AUX_SIZE_WORDS[named[0]]})" if named else ""
    other = "sum" if abs(weight - 1) <= 1e-6 else "mean" if abs(weight * dp - 1) <= 1e-6 else None
    advice = f"; declare --moe-aux-reduction {other} if that is the design in every layout" if other else ""
    return AUX_WEIGHTED.format(found=weight, implied=implied, declared="mean" if declared != 1 else "sum",
                               weight=declared, advice=advice)


def _differs_over_tp(
    values: Sequence[dict[str, Any]], wrong: Sequence[str], tp: int, allowed: float
) -> dict[str, list[int]]:
    """Each of the ``wrong`` replicated parameters whose gradients differ between the ranks of some tp group (ranks
    ``g * tp ...``, consecutive), with the ranks of the first such group; empty where none does."""
    found: dict[str, list[int]] = {}
    if tp < 2 or len(values) % tp:
        return found
    for name in wrong:
        for start in range(0, len(values), tp):
            got = [v["grads"][name][0] for v in values[start:start + tp]]
            if any(relative(g, got[0]) > allowed for g in got[1:]):
                found[name] = list(range(start, start + tp))
                break
    return found


def _torch_double_divide(values: Sequence[dict[str, Any]], allowed: float) -> str:
    """torch's FSDP2 double divide (:data:`~nemo_dist.conformance.suites.wrapper.torch_faults.DOUBLE_DIVIDE`)
    where every
    wrong gradient on every rank is one process's divided by the target's FSDP2 divide factor once more, and
    ``fully_shard`` alone, re-run over one-rank shard groups, does the same in float64 and not in float32."""
    from nemo_dist.conformance.suites.wrapper.torch_faults import DOUBLE_DIVIDE

    shown = values[0].get("torch_divide") if values else None
    if not shown:
        return ""
    factor = shown["factor"]
    pairs = [(got, want) for v in values for _, got, want in _compared(v, "gradients") if relative(got, want) > allowed]
    if not pairs or any(relative(got, None if want is None else want / factor) > allowed for got, want in pairs):
        return ""
    if abs(shown["float64"] - 1 / factor) > 1e-9 or abs(shown["float32"] - 1) > 1e-6:
        return ""
    return DOUBLE_DIVIDE.format(dtype=shown["dtype"], factor=factor, version=torch.__version__,
                                float64=shown["float64"], float32=shown["float32"], whose="target's")


def _summed_over_shards(got: torch.Tensor | None, want: torch.Tensor | None, size: int, allowed: float) -> bool:
    """Whether each of ``size`` equal dim-0 chunks of ``got`` is the sum of every chunk of ``want``."""
    if got is None or want is None or got.shape != want.shape or size < 2 or got.shape[0] % size:
        return False
    total = torch.stack(torch.chunk(want, size)).sum(dim=0)
    return all(relative(chunk, total) <= allowed for chunk in torch.chunk(got, size))
