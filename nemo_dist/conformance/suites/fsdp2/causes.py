"""How the fsdp2 suite registers a check, with the likely cause each check's failure names.

Every check of the suite is registered through :func:`fsdp2_check` (core,
component ``fsdp2``, torch's FSDP2 preloaded for the ranks, worlds of 2 or
more unless said). A check that observes one field or step of upstream's
FSDP2 path names it as the cause of its failure (:data:`CAUSES`); the checks
that compare numbers after training (``trains_like_one_process``,
``cpu_offload_trains_and_offloads``) name none of their own, as nothing they
see isolates one field: their failures say what differs. An assertion that
carries a cause of its own (the checkpointing contract's,
:mod:`~nemo_dist.conformance.suites.ddp.checkpoint_rules`) keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_dist.conformance.engine.registry import check, with_likely_cause

__all__ = ["CAUSES", "fsdp2_check"]

#: torch's FSDP2 (DTensor, sympy: about a second), imported once by the command's fork server for every rank.
_PRELOAD = ("torch.distributed.fsdp",)

#: Check name (without the ``fsdp2.`` prefix) -> the field or step its failure shows at fault.
CAUSES = {
    "shards_over_the_data_parallel_dims": "fully_shard not given the data-parallel mesh (dp_shard, or "
    "(dp_replicate, dp_shard) under HSDP) as upstream's mesh lays it out, or a layer left unsharded",
    "world_of_one_shards_nothing": "a world of one still sharded or cast: upstream returns the model as it was",
    "tied_embeddings_stay_tied": "the tied embedding and head sharded as two units (the weight untied), or a tied "
    "head inside a layer list accepted",
    "default_mp_policy_bf16_compute_fp32_reduce": "mp_policy=None not made upstream's default policy (bf16 params, "
    "fp32 reduce, no output cast, cast_forward_inputs=False), or the policy not passed to every unit",
    "mp_policy_fields_apply": "a MixedPrecisionPolicy field not passed to fully_shard as configured",
    "every_unit_holds_the_configured_policy": "the MixedPrecisionPolicy rebuilt or replaced before fully_shard: a "
    "field dropped (torch's default then applies: cast_forward_inputs=True) or changed for some unit",
    "state_dict_round_trips": "state dict keys changed by the wrapping, or a sharded state dict not loadable into "
    "another sharded model",
    "reshard_after_forward_chooses_units": "reshard_after_forward not chosen per unit as upstream does (the root "
    "never; with None every layer but the last, the input embedding, not the output head)",
    "deferred_sync_reduces_on_the_last_micro_batch": "get_sync_ctx does not switch gradient sync off for the "
    "non-final micro-batches (set_requires_gradient_sync not applied to every unit), or gradients lost while off",
    "functional_entry_point_keeps_upstream_defaults": "fsdp2_strategy_parallelize's defaults differ from "
    "upstream's, or its arguments not passed through to the config",
    "prefetch_chains_have_configured_depth": "forward or backward prefetch not set to the configured depths between "
    "consecutive layers",
    "activation_checkpointing_recomputes_selected_layers": "activation checkpointing not applied to the layer groups "
    "the scope selects before sharding",
}


def fsdp2_check(
    name: str, *, min_world: int = 2, max_world: int | None = None, once: bool = False
) -> Callable[[Callable[..., None]], Any]:
    """Register check ``fsdp2.NAME`` (see the module docstring); its failures name ``CAUSES[NAME]`` where it has
    one."""
    cause = CAUSES.get(name.removeprefix("fsdp2."))

    def register(run: Callable[..., None]) -> Any:
        return check(
            name, tier="core", component="fsdp2", preload=_PRELOAD, min_world=min_world, max_world=max_world,
            once=once,
        )(with_likely_cause(run, cause) if cause else run)

    return register
