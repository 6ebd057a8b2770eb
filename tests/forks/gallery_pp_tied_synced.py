"""torchtitan's manual split with the fix of torchtitan #1409 for a head tied to the embedding: the first and last
stage each hold a copy, and after each step of the schedule (before the optimizer's) the copies' gradients are
summed between the two ranks, so both copies train as the one tied weight. Correct, tied or not."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from tests.forks._pipelines import Loss, manual


class _SummingTiedCopies:
    """A schedule whose ``step`` runs the inner one, then all-reduces the tied copies' gradients between the first
    and the last stage's ranks."""

    def __init__(self, inner: Any, copies: list[Any], group: Any) -> None:
        self.inner, self.copies, self.group = inner, copies, group

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The inner schedule's step, then the copies' gradients summed."""
        found = self.inner.step(*args, **kwargs)
        for param in self.copies:
            dist.all_reduce(param.grad, group=self.group)
        return found


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss) -> Any:
    """torchtitan's split; where the head is tied to the embedding, the copies' gradients summed after each step."""
    schedule, stages = manual(model, pp_mesh, n_microbatches, loss_fn)
    if model.output.weight is not model.tok_embeddings.weight:
        return schedule, stages
    ranks = dist.get_process_group_ranks(pp_mesh.get_group())
    group = dist.new_group([ranks[0], ranks[-1]])  # every rank joins the call, as new_group requires
    module = stages[0].submod
    held = module.tok_embeddings if module.tok_embeddings is not None else module.output
    copies = [held.weight] if pp_mesh.get_local_rank() in (0, pp_mesh.size() - 1) and held is not None else []
    return _SummingTiedCopies(schedule, copies, group), stages
