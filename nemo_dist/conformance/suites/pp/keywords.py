"""Rank side of the keyword check: the target's pipeline stepped with packed ``position_ids`` as keyword inputs.

Every rank builds the same seeded model and keeps a copy for one process.
It hands the model to the target, reads whether each of its stages' modules
takes the keyword ``position_ids`` and which layers it holds, and gathers
that from every rank (one collective, on every rank alike, so every rank
decides alike whether to step). Where every stage and the model take it, the
rank runs the schedule's step on the whole batch with ``position_ids=``
given to ``schedule.step`` on every rank (torch's contract: a step's keyword
inputs go to each stage of that rank), positions that restart inside each
row (packed sequences), and compares the loss and every held gradient with
one process given the same positions. On the suite's own model it also
compares them with one process whose layers outside the first stage run
with their default positions (what a pipeline delivering keyword inputs to
the first stage only computes). One process runs as training does: a
transformers model with ``use_cache`` off. Cached per spec.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.adapters.target_raised import TargetRaised, run_once
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.pp import target
from nemo_dist.conformance.suites.pp.messages import Difference, KeywordRun, StageKeywords
from nemo_dist.conformance.suites.pp.models import TinyPipelineLM
from nemo_dist.conformance.suites.pp.placement import misplacement
from nemo_dist.conformance.suites.pp.ranks import (
    BUILDING,
    PLACING,
    SEED,
    batch,
    difference,
    gradient_difference,
    held_parameters,
    parameter_label,
    pp_mesh,
)

__all__ = ["BUILDING", "packed_positions", "run"]

_RUNS: dict[Any, KeywordRun | TargetRaised] = {}


def packed_positions(rows: int, seq: int) -> torch.Tensor:
    """``[rows, seq]`` positions of packed sequences: row r holds a document of ``2 + r % 3`` tokens, then the next
    document from position 0 again (never ``0..seq-1``)."""
    found = torch.empty(rows, seq, dtype=torch.long)
    for row in range(rows):
        cut = min(2 + row % 3, seq - 1)
        found[row] = torch.cat([torch.arange(cut), torch.arange(seq - cut)])
    return found


def run(impl: Implementation, spec: dict[str, Any]) -> KeywordRun:
    """Build and step as ``spec`` says (microbatches, schedule); the report described above, cached per spec."""
    return run_once(_RUNS, (impl, tuple(sorted((k, str(v)) for k, v in spec.items()))), lambda: _run(impl, spec))


def _layers(held: list[tuple[int, str, str | None, Any]], index: int) -> tuple[str, ...]:
    """The layers (``layers.3``) of the model whose parameters stage ``index`` holds, in order."""
    names = [".".join(k.split(".")[:2]) for i, _, k, _ in held if i == index and k and k.startswith("layers.")]
    return tuple(dict.fromkeys(names))


def _run(impl: Implementation, spec: dict[str, Any]) -> KeywordRun:
    microbatches, summed = int(spec["microbatches"]), target.token_sum(impl)
    model, vocab = target.build_model(impl, SEED)
    one = fresh_copy(model)
    _without_cache(one)
    first_only = fresh_copy(model) if isinstance(model, TinyPipelineLM) else None
    reference = dict(one.named_parameters())
    where = BUILDING
    try:
        made, stages = target.pipeline(impl, model, pp_mesh(), microbatches, spec.get("schedule"))
        held = held_parameters(stages, reference)
        mine = [StageKeywords(int(s.stage_index), target.takes_keyword(s.submod.forward),
                              _signature(s.submod.forward), _layers(held, int(s.stage_index))) for s in stages]
        where = "gathering every rank's stages"
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        every = sorted((stage for found in gathered for stage in found), key=lambda stage: stage.index)
        report = KeywordRun(stages=every, model_takes=target.takes_keyword(one.forward),
                            tolerance=target.tolerance(impl))
        where = PLACING
        report.misplaced = misplacement(stages)
        if report.misplaced is not None or not report.model_takes or not all(stage.takes for stage in every):
            return report
        ids, labels = batch(microbatches, summed, vocab)
        positions = packed_positions(*ids.shape)
        where = "in the step with keyword inputs (schedule.step)"
        losses: list[torch.Tensor] = []
        target.train_step(impl, made, stages, ids, labels, losses, {target.KEYWORD: positions})
        report.stepped = True
        want = _loss(one, ids, labels, positions)
        want.backward()
        if losses:
            got = torch.stack([loss.detach() for loss in losses]).sum().item()
            tokens = int((labels != target.IGNORE).sum().item())
            report.loss = (got / tokens if summed else got / len(losses), want.item())
        report.grads = {(i, parameter_label(i, n, k)): gradient_difference(p, reference.get(k or ""))
                        for i, n, k, p in held}
        if first_only is not None:
            grads, loss = _first_stage_only(first_only, every[0].layers, ids, labels, positions, held)
            report.first_only, report.first_only_loss = grads, loss if report.loss is not None else None
        return report
    except Exception as exc:  # the parent judges a raising target (checks.run_reports)
        raise TargetRaised(f"{where}: {type(exc).__name__}: {exc}") from exc


def _without_cache(model: torch.nn.Module) -> None:
    """One process runs as training does: a transformers model's config with ``use_cache`` off (with a cache,
    transformers builds a plain causal mask where packed ``position_ids`` without an attention mask otherwise give
    each document its own block, as pipeline stages, built without a cache, do)."""
    config: Any = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False


def _signature(fn: Any) -> str:
    import inspect

    try:
        return f"forward{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return "forward(...)"


def _loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One process's mean cross entropy of the whole batch given ``positions`` as the keyword input."""
    return target.one_process_loss(model, ids, labels, keywords={target.KEYWORD: positions})


def _first_stage_only(
    model: TinyPipelineLM, first_layers: tuple[str, ...], ids: torch.Tensor, labels: torch.Tensor,
    positions: torch.Tensor, held: list[tuple[int, str, str | None, Any]],
) -> tuple[dict[tuple[int, str], Difference | None], float]:
    """One process whose layers outside ``first_layers`` (the first stage's) ignore ``position_ids`` and run with
    their defaults: each held parameter's gradient against that variant's (:func:`~.ranks.difference`), and its
    loss."""
    for name, layer in model.layers.items():
        if f"layers.{name}" not in first_layers:
            inner = layer.forward
            layer.forward = lambda h, position_ids=None, _inner=inner: _inner(h)
    loss = _loss(model, ids, labels, positions)
    loss.backward()
    variant = dict(model.named_parameters())
    grads = {(i, parameter_label(i, n, k)): _variant_gradient(p, variant.get(k or "")) for i, n, k, p in held}
    return grads, loss.item()


def _variant_gradient(param: Any, reference: Any) -> Difference | None:
    """:func:`~.ranks.difference` of a held gradient and the variant's; None where either is missing."""
    if reference is None or param.grad is None or reference.grad is None:
        return None
    return difference(param.grad.detach(), reference.grad.detach())
