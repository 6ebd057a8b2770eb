"""How the a2a suite registers a check, and the likely causes its failures name.

Every check of the suite goes through :func:`a2a_check` (component ``a2a``);
a failure whose ranks' results show a known bug class (:func:`gradient_cause`)
carries that class as its cause, else the check's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from nemo_dist.conformance.deadlines import StepAborted
from nemo_dist.conformance.registry import check, with_likely_cause
from nemo_dist.testing import RankFailure

__all__ = ["CAUSES", "DETACHED", "MULTIPLIED", "NOT_SWAPPED", "PERMUTED", "a2a_check", "failure", "gradient_cause"]

#: The output is outside autograd: the gradient never reaches the rows that were sent.
DETACHED = (
    "the result is detached from autograd: a plain dist.all_to_all_single (or a .detach(), or a buffer written "
    "in place) where an autograd all-to-all was needed, so no gradient reaches the rows that were sent"
)
#: Every gradient a whole multiple of the right one.
MULTIPLIED = (
    "gradients {factor} times the right ones: the backward sums or scales what the inverse all-to-all already "
    "routes (an all-reduce after it, or a gradient counted once per rank)"
)
#: Gradients of the wrong shape: the backward sent them back with the forward's split sizes.
NOT_SWAPPED = (
    "backward does not swap the split sizes: the gradient goes back with the forward's input and output split "
    "sizes (right only when every rank sends each rank what it receives from it)"
)
#: The right gradient values on the wrong rows.
PERMUTED = (
    "gradient rows permuted: each sent row gets another row's gradient (the inverse all-to-all's blocks taken in "
    "another rank order, or the rows re-ordered after it and not put back)"
)

#: Check name (without the ``a2a.`` prefix) -> the likely cause of its failure.
CAUSES = {
    "forward_routes_rows_in_rank_order": "rows routed to the wrong rank or in the wrong order: input and output "
    "split sizes swapped, the source ranks' blocks placed out of rank order, a zero-size split mishandled, or the "
    "dtype changed on the way",
    "backward_returns_each_row_its_gradient": NOT_SWAPPED,
    "inputs_and_grads_not_modified": "the caller's input or the gradient passed to backward written in place "
    "(a buffer reused for the result, or the output's gradient scaled in place)",
    "group_is_honoured": "the process group ignored (the whole world's used), or a rank's place in the group taken "
    "from its global rank",
    "mismatched_sizes_refused_on_every_rank": "split sizes or row shapes passed to the collective unchecked: ranks "
    "that disagree on them make the backend abort the process (gloo), hang or deliver garbage (NCCL), where a small "
    "exchange of the sizes first would let every rank raise; or the refusal's own code raising instead",
    "bad_destinations_refused_on_every_rank": "destinations not checked against the group before counts are "
    "exchanged: a token addressed outside the group is dropped, clamped or crashes one rank while the others wait",
    "dispatch_combine_round_trips": "a token dispatched to the wrong rank or combined into the wrong place: the "
    "route's order not inverted in combine, or counts not exchanged so a receiver's splits are wrong",
}


def a2a_check(
    name: str, *, tier: Literal["core", "extended"] = "core", min_world: int = 1, once: bool = False
) -> Callable[[Callable[..., None]], Any]:
    """Register check ``a2a.NAME``; its failures name ``CAUSES[NAME]`` where they carry no cause of their own."""
    cause = CAUSES[name.removeprefix("a2a.")]

    def register(run: Callable[..., None]) -> Any:
        return check(name, tier=tier, component="a2a", min_world=min_world, once=once)(
            with_likely_cause(_rank_errors_explained(run, cause), cause)
        )

    return register


def _rank_errors_explained(run: Callable[..., None], cause: str) -> Callable[..., None]:
    """``run`` whose failures raised on the ranks (the call's own errors, not a crash) carry ``cause`` too:
    a backward that errors on uneven splits is the check's bug class, not a harness failure."""

    @functools.wraps(run)
    def explained(world: Any, impl: Any) -> None:
        try:
            run(world, impl)
        except (RankFailure, StepAborted) as exc:
            if not getattr(exc, "likely_cause", ""):
                setattr(exc, "likely_cause", cause)  # noqa: B010 (an attribute neither class declares)
            raise

    return explained


def failure(message: str, cause: str) -> AssertionError:
    """An ``AssertionError`` carrying its own likely cause."""
    exc = AssertionError(message)
    exc.likely_cause = cause  # type: ignore[attr-defined]
    return exc


def gradient_cause(got: Sequence[torch.Tensor | None], expected: Sequence[torch.Tensor]) -> str:
    """The bug class the ranks' input gradients show against the right ones ("" when none fits)."""
    if any(g is None for g in got):
        return DETACHED
    pairs = list(zip(got, expected, strict=True))
    if any(tuple(g.shape) != tuple(e.shape) for g, e in pairs):  # type: ignore[union-attr]
        return NOT_SWAPPED
    wide = [(g.double(), e.double()) for g, e in pairs]  # type: ignore[union-attr]
    if any(e.abs().sum() > 0 for _, e in wide):
        for factor in (2, 3, 4, 0.5):
            if all(torch.allclose(g, e * factor, rtol=1e-2, atol=0) for g, e in wide):
                return MULTIPLIED.format(factor=factor)
    if all(_same_rows(g, e) for g, e in wide):
        return PERMUTED
    return ""


def _same_rows(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``got`` holds ``expected``'s rows in some order."""
    if got.shape[0] == 0:
        return True
    flat_g, flat_e = got.reshape(got.shape[0], -1), expected.reshape(expected.shape[0], -1)
    key = lambda t: sorted(tuple(row.tolist()) for row in t)  # noqa: E731
    return key(flat_g) == key(flat_e)
