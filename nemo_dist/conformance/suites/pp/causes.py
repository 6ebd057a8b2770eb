"""How the pp suite registers a check, and the likely causes its failures name.

Every check goes through :func:`pp_check` (component ``pp``, worlds of 2
ranks or more: a pipeline of one stage has nothing to split). A cause is
named only where what the ranks reported proves it: every wrong gradient
(or the loss) exactly a factor of one process's (the microbatch count, its
inverse, the label tokens), every parameter of a stage without a gradient,
a parameter of the model held by no stage or by two. Otherwise a failure
says which tensor differs, by how much, on which rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from nemo_dist.conformance.engine.registry import WorldRule, check

__all__ = [
    "DETACHED",
    "DP_FACTORS",
    "DP_UNITS",
    "DROPPED",
    "DUPLICATED",
    "FACTORS",
    "KEYWORDS_FIRST_STAGE_ONLY",
    "NEVER_REDUCED",
    "NEVER_ZEROED",
    "NORM_TWICE",
    "RESCALED_ACCUMULATION",
    "TIED_NOT_SUMMED",
    "cause_of",
    "exact_factor",
    "pp_check",
]

#: An exact factor's name -> the likely cause of gradients (or a loss) that many times one process's.
FACTORS = {
    "M": "{what} {factor:g} times one process's (the microbatch count): each microbatch's part summed over the "
         "microbatches where it should be averaged (a schedule with scale_grads=False fed a mean loss, or a "
         "token-summed loss divided by one microbatch's share of the label tokens)",
    "1/M": "{what} 1/{inverse:g} of one process's (one over the microbatch count): averaged over the microbatches "
           "twice (a loss divided by the microbatch count inside a schedule that divides by it too, or "
           "scale_grads=True under a token-summed loss)",
    "tokens": "{what} {factor:g} times one process's (the batch's label tokens): a loss summed over the label "
              "tokens never divided by them (declare --pp-loss token_sum if your training loop divides after the "
              "step)",
    "tokens/M": "{what} {factor:g} times one process's (a microbatch's label tokens): a token-summed loss "
                "averaged over the microbatches instead of divided by the label tokens",
}

#: Composed with data parallelism: an exact factor's name -> the likely cause of every gradient that many times one
#: process's.
DP_FACTORS = {
    "dp": "every gradient is {factor:g} times one process's (the dp size): summed over the dp ranks where they "
          "should be averaged (an FSDP2 gradient divide factor of 1, or the label tokens divided by the dp size "
          "once more than FSDP2's average needs)",
    "1/dp": "every gradient is 1/{inverse:g} of one process's (one over the dp size): divided by the dp size once "
            "too often (FSDP2 already averages over the dp ranks, so the step divides by the batch's label tokens "
            "over the dp size; dividing by all of them, or a divide factor of the whole world, divides twice)",
}
#: The cause of the gradients of some FSDP2 units (and only those) a dp factor off.
DP_UNITS = (
    "the parameters of the FSDP2 units {units} ({names}) are {factor:g} times one process's and every other unit's "
    "equal it: "
    "those units reduce over the dp ranks with another divide factor than the rest (set_gradient_divide_factor "
    "sets only the unit it is called on: a factor set on a stage's root does not reach its layers' units)"
)
#: The cause of gradients that equal one process's given a dp rank's rows alone.
NEVER_REDUCED = (
    "the gradients are never reduced over the dp ranks: each rank's equal one process's given that rank's rows "
    "alone (the stages not sharded or replicated over dp_mesh, or its reduction skipped)"
)
#: The cause of accumulated gradients whose earlier steps' part is divided by the microbatch count again.
RESCALED_ACCUMULATION = (
    "the first step's part of the accumulated gradients is 1/{m:g} of what it should be and the last step's is "
    "right: torch's schedule with scale_grads=True divides the whole .grad by the microbatch count at the end of "
    "every step (PipelineStage.scale_grads, torch 2.13), so gradients left from earlier steps are divided again "
    "(torchtitan PR #1732's class). torch's behaviour, not your split: accumulate with scale_grads=False and a "
    "loss the loop scales (upstream's token-sum contract does)"
)
#: The cause of a stage whose parameters get no gradient.
DETACHED = (
    "the parameters of stage {stages} get no gradient while one process's are nonzero: the stage's output "
    "detached from the graph (or its backward skipped), so the gradient sent back to it reaches none of them, "
    "and torch raises nothing"
)
#: The cause of tied copies whose gradients are each one use's part (they sum to one process's).
TIED_NOT_SUMMED = (
    "each stage's copy of the tied {name} (stages {stages}) gets only its own use's gradient, never summed with the "
    "other copies' (torchtitan #1409): the copies drift apart as they train"
)
#: The cause of parameters of the model that no stage holds.
DROPPED = (
    "the stages hold none of {layers}: a layer dropped by the stage split (an uneven layer count cut short, "
    "layers // stages on each stage)"
)
#: The cause of a loss and gradients that equal one process's with its final norm applied twice (the suite's model).
NORM_TWICE = (
    "the final norm is applied twice: {what} one process's with the model's final norm applied twice (a stage "
    "that normalizes its output before a head that normalizes again)"
)
#: The cause of a second step's gradients that hold the first step's.
NEVER_ZEROED = (
    "the gradients are never zeroed between steps: every gradient of the second step is one process's plus "
    "{c:.6g} times the first step's (left in .grad, added to, and scaled again by whatever the loop does after the "
    "step)"
)
#: The cause of a loss and gradients that equal one process's whose layers after the first stage ignore the positions.
KEYWORDS_FIRST_STAGE_ONLY = (
    "keyword inputs reach only the first stage: the loss and every gradient equal one process's with the "
    "position_ids given to the first stage's layers ({layers}) and the other layers running with their default "
    "positions (a later stage's forward that drops the keyword inputs its step hands it, or a step given them on "
    "the first stage's rank only; Megatron-LM #752's class)"
)
#: The cause of parameters of the model that two stages hold.
DUPLICATED = "{layers} held by two stages: a layer at a stage boundary held (and run) twice"

#: What the ranks import once, when a world starts.
_PRELOAD = ("torch.distributed.pipelining",)
#: How close a ratio must be to a factor, and how close the values to that multiple, to prove it.
_EXACT = 1e-9


def exact_factor(ratios: list[tuple[float, float]], sizes: dict[str, float], tolerance: float = 0.0) -> str | None:
    """The name of the factor of ``sizes`` (``{"M": 4, "tokens": 48, ...}``) that every ``(ratio, residual)``
    is exactly (ratio within 1e-9 of it, or ``tolerance`` where larger, residual below the same), else None; a
    factor of 1 proves nothing."""
    if not ratios:
        return None
    exact = max(_EXACT, tolerance)
    for name, factor in sizes.items():
        if factor == 1 or not math.isfinite(factor):
            continue
        if all(abs(r - factor) <= exact * factor and res <= exact for r, res in ratios):
            return name
    return None


def cause_of(name: str, what: str, sizes: dict[str, float]) -> str:
    """The text :data:`FACTORS` gives factor ``name`` of ``sizes`` for ``what`` (gradients, the loss)."""
    factor = sizes[name]
    return FACTORS[name].format(what=what, factor=factor, inverse=1 / factor if factor else 0)


def pp_check(name: str, *, tier: Literal["core", "extended"] = "core",
             rule: WorldRule | None = None) -> Callable[[Callable[..., None]], Any]:
    """Register check ``pp.NAME``: worlds of 2 ranks or more, its whole matrix of schedules and microbatch counts
    in the run's smallest such world, a sample in the others; with ``rule``, once, in the smallest world that
    fits it."""

    def register(run: Callable[..., None]) -> Any:
        return check(name, tier=tier, component="pp", min_world=2, sampled=rule is None, once=rule is not None,
                     rule=rule, preload=_PRELOAD)(run)

    return register
