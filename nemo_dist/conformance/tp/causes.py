"""How the tp suite registers a check, with the likely cause each check's failure names.

Every check of the suite goes through :func:`tp_check` (component ``tp``,
torch's tensor parallelism preloaded for the ranks); an assertion that
carries a cause of its own (a diagnosis from what the ranks reported) keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from nemo_dist.conformance.registry import WorldRule, check, failure, with_likely_cause

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

#: Check name (without the ``tp.`` prefix) -> the likely cause of its failure.
CAUSES = {
    "forward_equals_unsharded": "a row-wise layer's output handed on as per-rank partial sums (its all-reduce, or "
    "a bias added before it, wrong), the local vocabulary shard returned as the logits, a fused projection split "
    "naively, head counts left global, or a sequence-parallel input already local sharded again",
    "gradients_equal_unsharded": "a gradient reduced twice or never: no input-gradient all-reduce before a "
    "column-wise layer, an autograd all-reduce whose backward reduces again, or replicated parameters' gradients "
    "left partial per rank",
    "trains_like_one_process": "parameters updated from wrong or per-rank gradients: replicated parameters drift "
    "apart across tensor-parallel ranks, or a sharded gradient summed into an unsharded one",
    "placements_are_consistent": "a parameter's local shard not the part of the full tensor its placements say "
    "(a hand-made DTensor with the wrong placements or shape)",
    "loss_on_sharded_logits_equals_unsharded": "logits sharded on the vocabulary scored as if whole, or logits "
    "whose placements do not say what they hold",
    "tied_embeddings_stay_tied": "parallelize_module replaced the embedding's and the head's weights one by one "
    "and the tie was not restored",
    "attention_head_counts_are_local": "attention's head counts left global (or divided twice) while its "
    "projections hold one rank's heads",
    "sequence_length_not_divisible_refused_or_correct": "a sequence TP does not divide sharded unevenly and "
    "gathered as if even (rows lost or tiled), or refused on some ranks only",
    "fsdp2_on_a_dp_tp_mesh_trains_like_one_process": "FSDP2 and TP not composed on the (dp_shard, tp) mesh: "
    "gradients not averaged over dp, or TP's DTensors resharded over the wrong mesh dim",
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
    """Register check ``tp.NAME`` (see the module docstring); its failures name ``CAUSES[NAME]``.

    ``rule``: the worlds it runs in (default :data:`SPLITS`). ``sampled``: the whole matrix of models and
    variants in a world of one and in the run's smallest world of two or more ranks, a sample elsewhere
    (:data:`~nemo_dist.conformance.tp.checks.SAMPLE`).
    """
    cause = CAUSES[name.removeprefix("tp.")]

    def register(run: Callable[..., None]) -> Any:
        return check(
            name, tier=tier, component="tp", preload=(*_PRELOAD, *preload), min_world=min_world,
            max_world=max_world, sampled=sampled, once=once, rule=rule,
        )(with_likely_cause(run, cause))

    return register
