"""Training-loop steps around the bundled pipeline, checked with ``--pp-step`` (the loop is where gradients are
zeroed and divided after the schedule's step). Each is called as ``fn(schedule, stages, inputs, labels, losses)``
on every rank with the whole batch, as upstream's recipe holds it:

- ``upstream_loop``: zero, ``schedule.step`` (the batch's keyword inputs, packed ``position_ids``, passed on to it),
  every gradient divided by the batch's label tokens (upstream's contract); composed with data parallelism
  (``dp_mesh``), by the label tokens of every dp rank's rows (summed over ``dp_mesh``) over the dp size, since
  FSDP2 has averaged over the dp ranks. Correct.
- ``never_zeroes``: the same without zeroing: the second step's gradients pile onto the first's.
- ``divides_without_dp_size``: upstream's loop composed with data parallelism dividing by every dp rank's label
  tokens without the dp size (as one process would): FSDP2's average over dp then divides a second time, every
  gradient 1/dp of one process's.
- ``divides_by_microbatch_tokens``: divided by one microbatch's share of the label tokens (the count taken from
  the microbatch, not the batch, as a gradient-accumulation loop rescaling at each microbatch does): M times
  too large.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.distributed.pipeline_parallel import count_label_tokens, scale_grads_by_tokens


def _step(schedule: Any, stages: list[Any], inputs: torch.Tensor, labels: torch.Tensor,
          losses: list[torch.Tensor], **keywords: torch.Tensor) -> None:
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    schedule.step(*((inputs,) if first else ()), target=labels if last else None, losses=losses if last else None,
                  **keywords)


def _zero(stages: list[Any]) -> None:
    for stage in stages:
        stage.submod.zero_grad(set_to_none=True)


def _tokens(labels: torch.Tensor, dp_mesh: Any) -> int:
    """The label tokens of every dp rank's rows (this rank's where there is no ``dp_mesh``)."""
    found = torch.tensor([count_label_tokens(labels)])
    if dp_mesh is not None:
        dist.all_reduce(found, group=dp_mesh.get_group())
    return int(found.item())


def upstream_loop(schedule: Any, stages: list[Any], inputs: torch.Tensor, labels: torch.Tensor,
                  losses: list[torch.Tensor], *, dp_mesh: Any = None, **keywords: torch.Tensor) -> None:
    """Zero, step (the keyword inputs passed on, on every rank), divide by the batch's label tokens over the dp
    size."""
    _zero(stages)
    _step(schedule, stages, inputs, labels, losses, **keywords)
    scale_grads_by_tokens(stages, _tokens(labels, dp_mesh), dp_mesh.size() if dp_mesh is not None else 1)


def divides_without_dp_size(schedule: Any, stages: list[Any], inputs: torch.Tensor, labels: torch.Tensor,
                            losses: list[torch.Tensor], *, dp_mesh: Any = None) -> None:
    """Zero, step, divide by every dp rank's label tokens, the dp size left out."""
    _zero(stages)
    _step(schedule, stages, inputs, labels, losses)
    scale_grads_by_tokens(stages, _tokens(labels, dp_mesh))


def never_zeroes(schedule: Any, stages: list[Any], inputs: torch.Tensor, labels: torch.Tensor,
                 losses: list[torch.Tensor]) -> None:
    """Step and divide, never zeroing: every step's gradients added to the last ones'."""
    _step(schedule, stages, inputs, labels, losses)
    scale_grads_by_tokens(stages, count_label_tokens(labels))


def divides_by_microbatch_tokens(schedule: Any, stages: list[Any], inputs: torch.Tensor, labels: torch.Tensor,
                                 losses: list[torch.Tensor]) -> None:
    """Zero, step, divide by the label tokens over the microbatch count."""
    _zero(stages)
    _step(schedule, stages, inputs, labels, losses)
    microbatches = schedule._n_microbatches
    scale_grads_by_tokens(stages, count_label_tokens(labels), dp_size=microbatches)
