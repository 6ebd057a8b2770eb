"""The accumulation check: two schedule steps accumulated before one optimizer step equal one process.

A training loop with gradient accumulation calls ``schedule.step`` several
times before the optimizer steps, clearing the gradients only before the
first. The gradients must then be what one process computes over all the
steps' batches: under ``token_sum`` the mean over all their label tokens
(the loop divides once, after the last step), under ``mean`` the mean of
the batch means (the loop divides by the step count). The rank side is
:mod:`.accumulation`.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, failure
from nemo_dist.conformance.suites.pp import accumulation
from nemo_dist.conformance.suites.pp.causes import RESCALED_ACCUMULATION, pp_check
from nemo_dist.conformance.suites.pp.checks import differing, in_turn
from nemo_dist.conformance.suites.pp.ranks import within

__all__ = ["accumulated_steps_equal_one_process"]

#: How close a fitted coefficient must be to its factor, and the fit's residual to nothing, to prove a cause.
_EXACT = 1e-9


@pp_check("pp.accumulated_steps_equal_one_process", tier="extended")
def accumulated_steps_equal_one_process(world: WorldLike, impl: Implementation) -> None:
    """Two schedule steps on two batches, the gradients cleared only before the first, then divided once (by both
    batches' label tokens under ``token_sum``, by the two steps under ``mean``): every gradient equals one
    process's over both batches. One schedule a world (taken in turn), as many microbatches as ranks (twice as
    many where every rank refuses that count).

    Extended: it checks a training loop's accumulation beyond the core contract. NOT APPLICABLE under
    ``--pp-step`` (the suite cannot accumulate through a step function that clears the gradients itself), or
    where every rank refuses to build the pipeline (the core checks judge that). The likely cause is named only
    where every rank's gradients are exactly the last step's part plus 1/M of the first's (torch's
    ``scale_grads=True`` rescaling the accumulated gradients).
    """
    if impl.suite_option("pp_step") is not None:
        raise NotApplicable("--pp-step names the training loop's step, which clears the gradients itself: the suite "
                            "cannot accumulate two steps through it")
    where, found = in_turn(world, impl, accumulation.run, ", two steps accumulated")
    lines = []
    for rank, report in enumerate(found):
        wrong = {label: pair for label, pair in report.grads.items() if not within(pair, report.tolerance)}
        lines += differing(f"  rank {rank}: ", wrong, len(report.grads))
    if not lines:
        return
    message = f"{where}: the accumulated gradients differ from one process's over both batches:\n" + "\n".join(lines)
    m = found[0].microbatches
    fits = [report.fit for report in found]
    exact = max(_EXACT, max(report.tolerance for report in found))
    if all(fit is not None and abs(fit[0] - 1 / m) <= exact and abs(fit[1] - 1) <= exact and fit[2] <= exact
           for fit in fits) and m > 1:
        raise failure(message, RESCALED_ACCUMULATION.format(m=m))
    raise AssertionError(message)
