"""How the tp suite registers a check, and the likely causes its failures name.

Every check of the suite goes through :func:`tp_check` (component ``tp``,
torch's tensor parallelism preloaded for the ranks). A check whose failure is
itself the proof of one cause (the tie broken, the chooser's order, a shard
that is not its placement's part) names it (:data:`CAUSES`); the numeric
checks (forward, gradients, training, loss, uneven sequences, FSDP2 on a
(dp, tp) mesh) name a cause only where a diagnosis from what the ranks
reported proves it (:data:`MULTIPLIED`, :data:`REPLICA_SYNC`,
:data:`RANKS_DISAGREE`) and otherwise say what differs, by how much, on which
ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from nemo_dist.conformance.engine.registry import WorldRule, check, failure, with_likely_cause

__all__ = ["CAUSES", "KV_HEADS", "MULTIPLIED", "RANKS_DISAGREE", "REPLICA_SYNC", "SPLITS", "failure", "tp_check"]

#: Key-value heads of the suite's model and of the tiny transformers configs: a world they do not divide cannot
#: hold one tensor-parallel group of them.
KV_HEADS = 4


def _heads_split(size: int) -> bool:
    return KV_HEADS % size == 0


#: The worlds a tensor-parallel group of the whole world fits the checked models' heads in.
SPLITS = WorldRule(
    _heads_split,
    f"the checked models' {KV_HEADS} key-value heads do not split over {{size}} ranks "
    "(tp.indivisible_heads_refused_on_every_rank checks such a world)",
)

_PRELOAD = ("torch.distributed.tensor.parallel",)

#: The cause of gradients wrong on replicated parameters only, each rank holding its own shard's part.
REPLICA_SYNC = (
    "replicated parameters' gradients are partial per rank (each covers only its own shard of the heads or the "
    "sequence) and are never summed over the tensor-parallel group: a missing replica sync (if your training loop "
    "takes that step after backward, declare it with --tp-after-backward)"
)

#: The cause of logits that differ between the ranks of one tensor-parallel group.
RANKS_DISAGREE = (
    "the ranks of one tensor-parallel group compute different logits from the same batch: random state that "
    "differs between them (dropout seeded per rank inside the group) or an input taken per rank"
)

#: The cause of gradients exactly the tensor-parallel size times the unsharded ones.
MULTIPLIED = (
    "gradients {size} times the unsharded ones (the tensor-parallel size): summed over ranks that each held the "
    "whole of it already: an autograd all-reduce whose backward reduces again, or a whole input taken as one "
    "rank's shard (a sequence-parallel style fed a tensor that is already whole)"
)

#: Check name (without the ``tp.`` prefix) -> the cause its failure proves (the numeric checks have none).
CAUSES = {
    "placements_are_consistent": "a parameter's local shard not the part of the full tensor its placements say",
    "tied_embeddings_stay_tied": "parallelize_module replaced the embedding's and the head's weights one by one "
    "and the tie was not restored",
    "attention_head_counts_are_local": "attention's head counts left global (or divided twice) while its "
    "projections hold one rank's heads",
    "logits_stay_sharded_on_the_vocabulary": "the head's output layout not Shard(-1): the logits gathered (or "
    "sharded on another dim) where upstream's plans keep them vocabulary-parallel",
    "explicit_plan_comes_first": "the plan chooser's order: an explicit tp_shard_plan not taken before the "
    "optimized, Hugging Face or default plan",
    "indivisible_heads_refused_on_every_rank": "head counts that do not split over the tensor-parallel ranks "
    "accepted, giving wrong shapes or numbers, or refused on some ranks only",
}


def tp_check(
    name: str,
    *,
    tier: Literal["core", "extended"] = "core",
    min_world: int = 1,
    max_world: int | None = None,
    preload: tuple[str, ...] = (),
    sampled: bool = True,
    once: bool = False,
    rule: WorldRule | None = SPLITS,
) -> Callable[[Callable[..., None]], Any]:
    """Register check ``tp.NAME`` (see the module docstring); its failures name ``CAUSES[NAME]`` where it has one.

    ``rule``: the worlds it runs in (default :data:`SPLITS`). ``sampled``: the whole matrix of models and
    variants in a world of one and in the run's smallest world of two or more ranks, a sample elsewhere
    (:data:`~nemo_dist.conformance.suites.tp.checks.SAMPLE`).
    """
    cause = CAUSES.get(name.removeprefix("tp."))

    def register(run: Callable[..., None]) -> Any:
        return check(
            name, tier=tier, component="tp", preload=(*_PRELOAD, *preload), min_world=min_world,
            max_world=max_world, sampled=sampled, once=once, rule=rule,
        )(with_likely_cause(run, cause) if cause else run)

    return register
