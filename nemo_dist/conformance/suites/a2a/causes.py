"""How the a2a suite registers a check, and the likely causes its failures name, each only where a diagnostic
proves it.

Every check of the suite goes through :func:`a2a_check` (component ``a2a``).
A failure names a cause only where the ranks' results show it
(:func:`gradient_cause`, :func:`routing_cause`), a re-run shows it
(:data:`NONDETERMINISTIC`), or the check's own comparison is the proof
(the bytes of the caller's tensors before and after, a rank that raised
nothing): otherwise its message says what differs, on which rank, and no
cause is printed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from nemo_dist.conformance.engine.registry import check, failure, with_likely_cause
from nemo_dist.conformance.suites.ddp.expectations import unit_roundoff

__all__ = [
    "CAUSES",
    "DETACHED",
    "GROUP",
    "IN_PLACE",
    "LOWER_DTYPE",
    "MULTIPLIED",
    "NONDETERMINISTIC",
    "NOT_GROUP",
    "NOT_SWAPPED",
    "PERMUTED",
    "REDUCED",
    "SPLITS_SWAPPED",
    "a2a_check",
    "failure",
    "gradient_cause",
    "routing_cause",
]

#: The output is outside autograd: the gradient never reaches the rows that were sent.
DETACHED = (
    "the result is detached from autograd: a plain dist.all_to_all_single (or a .detach(), or a buffer written "
    "in place) where an autograd all-to-all was needed, so no gradient reaches the rows that were sent"
)
#: Every gradient an exact multiple of the right one.
MULTIPLIED = (
    "gradients exactly {factor} times the right ones on every rank{divisor}: the backward scales what the inverse "
    "all-to-all already routes exactly"
)
#: Every gradient of the wrong shape, each the rows the forward received; or right on symmetric splits alone.
NOT_SWAPPED = (
    "backward does not swap the split sizes: the gradient goes back with the forward's input and output split "
    "sizes (each rank's input gradient has as many rows as it received in forward, or the same call is right when "
    "every rank sends each rank what it receives from it and wrong otherwise)"
)
#: The right gradient values on the wrong rows.
PERMUTED = (
    "gradient rows permuted: each rank's input gradient holds the right rows in another order (the inverse "
    "all-to-all's blocks taken in another rank order, or the rows re-ordered after it and not put back)"
)
#: Every gradient the right one rounded through a lower dtype.
LOWER_DTYPE = (
    "gradients rounded through {dtype}: every rank's input gradient equals the right one cast to {dtype} and back "
    "(the backward exchanges or computes in {dtype})"
)
#: Every rank's gradient the sum of every rank's right one.
REDUCED = (
    "the backward reduces over the ranks: every rank's input gradient is the sum of all ranks' right ones (an "
    "all-reduce after, or instead of, the inverse all-to-all)"
)
#: A re-run of the same example gave other values.
NONDETERMINISTIC = (
    "the same example run again on the same ranks gives other values: a result read before its collective finished "
    "(an async work never waited on) or read from memory nothing wrote"
)
#: The caller's tensors changed (proven by their bytes before and after the call).
IN_PLACE = (
    "the caller's input or the gradient passed to backward is written in place (their bytes differ after the "
    "call; the results may be right)"
)
#: Every output of the wrong shape, each the rows the rank sent.
SPLITS_SWAPPED = (
    "input and output split sizes swapped: each rank's output has as many rows as it sent, not as many as it was "
    "sent"
)

#: The exchange is right over the whole world and wrong over the groups.
GROUP = (
    "the process group is not honoured: the same target exchanges rightly over the whole world and wrongly over the "
    "groups (the whole world's group used, or a rank's place in its group taken from its global rank)"
)
#: The exchange is wrong over the whole world too.
NOT_GROUP = (
    "not the groups: the same target is wrong over the whole world too (its routing or backward checks say how)"
)

#: Check name (without the ``a2a.`` prefix) -> the cause its failure proves by itself ("": only a diagnosed one).
CAUSES = {
    "forward_routes_rows_in_rank_order": "",
    "backward_returns_each_row_its_gradient": "",
    "inputs_and_grads_not_modified": IN_PLACE,
    "group_is_honoured": "",
    "mismatched_sizes_refused_on_every_rank": "split sizes or row shapes that disagree between ranks are not "
    "refused on every rank before the exchange",
    "bad_destinations_refused_on_every_rank": "a destination outside the group is not refused on every rank before "
    "counts are exchanged",
    "dispatch_combine_round_trips": "",
}


def a2a_check(
    name: str, *, tier: Literal["core", "extended"] = "core", min_world: int = 1, once: bool = False
) -> Callable[[Callable[..., None]], Any]:
    """Register check ``a2a.NAME``; its failures name ``CAUSES[NAME]`` (where not empty) when they carry no cause
    of their own."""
    cause = CAUSES[name.removeprefix("a2a.")]

    def register(run: Callable[..., None]) -> Any:
        return check(name, tier=tier, component="a2a", min_world=min_world, once=once)(
            with_likely_cause(run, cause) if cause else run
        )

    return register


#: Factors a scaled gradient is named by, with the divisor each implies in a group of W.
_FACTORS = ((2.0, "W = 2"), (3.0, "W = 3"), (4.0, "W = 4"), (0.5, "1/W, W = 2"), (1 / 3, "1/W, W = 3"),
            (0.25, "1/W, W = 4"))


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, roundings: float = 4.0) -> bool:
    """Whether ``got`` equals ``want`` within ``roundings`` of ``dtype``'s unit roundoff, relative to ``want``."""
    scale = float(want.abs().max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=0, atol=roundings * unit_roundoff(dtype) * max(scale, 1e-30)))


def gradient_cause(
    got: Sequence[torch.Tensor | None], expected: Sequence[torch.Tensor], received: Sequence[int] | None = None,
    group_size: int | None = None,
) -> str:
    """The bug class the ranks' input gradients prove against the right ones ("" where none is proven).

    ``received[r]``: the rows rank r received in forward, which a gradient
    sent back with unswapped split sizes has; ``group_size``: the W a scale
    factor is named against.
    """
    if any(g is None for g in got):
        return DETACHED
    pairs = [(g, e) for g, e in zip(got, expected, strict=True) if g is not None]
    if any(tuple(g.shape) != tuple(e.shape) for g, e in pairs):
        if received is not None and all(g.shape[0] == n for (g, _), n in zip(pairs, received, strict=True)):
            return NOT_SWAPPED
        return ""
    dtype = pairs[0][1].dtype if pairs else torch.float64
    wide = [(g.double(), e.double()) for g, e in pairs]
    if all(torch.equal(g, e) for g, e in wide) or not any(e.abs().sum() > 0 for _, e in wide):
        return ""
    for factor, divisor in _FACTORS:
        if all(_close(g, e * factor, dtype) for g, e in wide):
            implied = f" ({divisor})" if group_size is not None and divisor.endswith(f"W = {group_size}") else ""
            return MULTIPLIED.format(factor=f"{factor:.4g}", divisor=implied)
    for lower in (torch.bfloat16, torch.float16):
        if unit_roundoff(lower) > unit_roundoff(dtype) and all(
            torch.equal(g, e.to(lower).double()) for g, e in wide
        ):
            return LOWER_DTYPE.format(dtype=str(lower).removeprefix("torch."))
    if len({tuple(e.shape) for _, e in wide}) == 1 and len(wide) > 1:
        total = torch.stack([e for _, e in wide]).sum(dim=0)
        if all(_close(g, total, dtype, roundings=4.0 * len(wide)) for g, _ in wide):
            return REDUCED
    if all(_same_rows(g, e) for g, e in wide):
        return PERMUTED
    return ""


def routing_cause(got: Sequence[Any], expected: Sequence[torch.Tensor], sent: Sequence[int]) -> str:
    """The bug class the ranks' outputs prove against the right ones ("" where none is proven); ``sent[r]``: the
    rows rank r sent, which an output routed with swapped split sizes has."""
    if not all(isinstance(g, torch.Tensor) for g in got):
        return ""
    pairs = list(zip(got, expected, strict=True))
    if any(g.dtype != e.dtype for g, e in pairs):
        return ""
    if any(tuple(g.shape) != tuple(e.shape) for g, e in pairs):
        return SPLITS_SWAPPED if all(g.shape[0] == n for (g, _), n in zip(pairs, sent, strict=True)) else ""
    if any(not torch.equal(g, e) for g, e in pairs) and all(_same_rows(g.double(), e.double()) for g, e in pairs):
        return PERMUTED.replace("gradient rows permuted: each rank's input gradient", "rows permuted: each rank's "
                                "output").replace("inverse all-to-all's blocks", "source ranks' blocks")
    return ""


def _same_rows(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``got`` holds ``expected``'s rows in some order."""
    if got.shape[0] == 0:
        return True
    flat_g, flat_e = got.reshape(got.shape[0], -1), expected.reshape(expected.shape[0], -1)
    key = lambda t: sorted(tuple(row.tolist()) for row in t)  # noqa: E731
    return key(flat_g) == key(flat_e)
