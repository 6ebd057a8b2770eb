"""Rank side of the accumulation check: two schedule steps accumulated before one optimizer step, against one process.

Every rank builds the same seeded model, keeps a copy for one process, and
hands the model to the target. With every gradient cleared once, the
schedule steps a batch A and then a batch B (the same shape, other tokens
and labels) without clearing between them, as a training loop accumulating
two steps does; then, under ``token_sum``, every gradient is divided by the
label tokens of both batches, and under ``mean`` by the two steps. One
process computes what that should be (the mean over both batches' label
tokens, or the mean of the two batch means) and each batch's part of it
alone, and every held gradient is compared with the first and fitted as
``a * A's part + b * B's part`` (least squares over the rank's held
parameters): ``a`` is the factor by which the earlier step's gradients were
rescaled. Cached per spec.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.conformance.adapters.target_raised import TargetRaised, run_once
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.pp import target
from nemo_dist.conformance.suites.pp.messages import AccumulationRun
from nemo_dist.conformance.suites.pp.placement import misplacement
from nemo_dist.conformance.suites.pp.ranks import (
    BUILDING,
    PLACING,
    SEED,
    batch,
    gradient_difference,
    held_parameters,
    parameter_label,
    pp_mesh,
)

__all__ = ["run"]

_RUNS: dict[Any, AccumulationRun | TargetRaised] = {}


def run(impl: Implementation, spec: dict[str, Any]) -> AccumulationRun:
    """Build and accumulate as ``spec`` says (microbatches, schedule); the report described above, cached."""
    return run_once(_RUNS, (impl, tuple(sorted((k, str(v)) for k, v in spec.items()))), lambda: _run(impl, spec))


def _second(ids: torch.Tensor, labels: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch B: A's shape and ignored labels, other tokens and labels."""
    return (ids + 1) % vocab, torch.where(labels == target.IGNORE, labels, (labels + 3) % vocab)


def _part(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
    """Each parameter's gradient of one process's summed (``scale`` divides it) cross entropy over ``ids``."""
    model.zero_grad(set_to_none=True)
    (target.one_process_loss(model, ids, labels, summed=True) / scale).backward()
    return {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
            for name, p in model.named_parameters()}


def _run(impl: Implementation, spec: dict[str, Any]) -> AccumulationRun:
    microbatches, summed = int(spec["microbatches"]), target.token_sum(impl)
    model, vocab = target.build_model(impl, SEED)
    one = fresh_copy(model)
    reference = dict(one.named_parameters())
    where = BUILDING
    try:
        made, stages = target.pipeline(impl, model, pp_mesh(), microbatches, spec.get("schedule"))
        held = held_parameters(stages, reference)
        report = AccumulationRun(microbatches=microbatches, tolerance=target.tolerance(impl))
        where = PLACING
        report.misplaced = misplacement(stages)
        if report.misplaced is not None:
            return report
        ids_a, labels_a = batch(microbatches, summed, vocab)
        ids_b, labels_b = _second(ids_a, labels_a, vocab)
        tokens_a, tokens_b = (int((labels != target.IGNORE).sum().item()) for labels in (labels_a, labels_b))
        params = [param for *_, param in held]
        for param in params:
            param.grad = None
        for step, (ids, labels) in enumerate(((ids_a, labels_a), (ids_b, labels_b))):
            where = f"in accumulation step {step + 1} (schedule.step, gradients not cleared)"
            target.schedule_step(made, stages, ids, labels, [])
        divisor = tokens_a + tokens_b if summed else 2
        for param in params:
            if param.grad is not None:
                param.grad.div_(divisor)
        # One process: each batch's part (its summed loss over the shared divisor, or its mean over two).
        part_a = _part(one, ids_a, labels_a, tokens_a + tokens_b if summed else 2 * tokens_a)
        part_b = _part(one, ids_b, labels_b, tokens_a + tokens_b if summed else 2 * tokens_b)
        for name, param in reference.items():
            param.grad = part_a[name] + part_b[name]
        report.grads = {parameter_label(i, n, k): gradient_difference(p, reference.get(k or "")) for i, n, k, p in held}
        report.fit = _fit(held, part_a, part_b)
        return report
    except Exception as exc:  # the parent judges a raising target (checks.run_reports)
        raise TargetRaised(f"{where}: {type(exc).__name__}: {exc}") from exc


def _fit(held: list[tuple[int, str, str | None, Any]], part_a: dict[str, torch.Tensor],
         part_b: dict[str, torch.Tensor]) -> tuple[float, float, float] | None:
    """``(a, b, residual)``: the least-squares ``a``, ``b`` with every held gradient ``a * A's part + b * B's part``,
    and the largest difference left relative to max(1, max |gradient|); None where it is not determined."""
    rows = [(p.grad.detach().double().flatten(), part_a[k].double().flatten(), part_b[k].double().flatten())
            for _, _, k, p in held if k and p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if not rows:
        return None
    got = torch.cat([g for g, _, _ in rows])
    basis = torch.stack([torch.cat([a for _, a, _ in rows]), torch.cat([b for _, _, b in rows])], dim=1)
    if torch.linalg.matrix_rank(basis) < 2:
        return None
    coefficients = torch.linalg.lstsq(basis, got.unsqueeze(1)).solution.flatten()
    left = (basis @ coefficients - got).abs().max().item() / max(1.0, got.abs().max().item())
    return float(coefficients[0]), float(coefficients[1]), left
