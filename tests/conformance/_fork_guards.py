"""What each broken fork under ``tests/forks`` must fail: its guarding checks, their messages, its likely cause.

Read by ``test_forks.py`` (in gloo worlds) and ``tests/gpu/test_forks_nccl.py``
(the same guards in NCCL worlds).
"""

from __future__ import annotations

__all__ = ["GUARDS", "LIKELY_CAUSES"]

#: The bucket check's failure at the smallest cap (torch gives 8 buckets there), by the fork's bucket count.
_BUCKETS = (
    r"bucket_cap_mb=0\.004: rank \d's DDP gave {got} bucket\(s\), "
    r"torch's DistributedDataParallel\(bucket_cap_mb=0\.004\) gives 8"
)


def _accepted(value: str) -> tuple[str, str]:
    """The guard of a config fork accepting a bad value: the extended check, its message for ``value`` (a pattern)."""
    return ("config.rejects_bad_values_naming_field", rf"DDPConfig\({value}\) was accepted")


#: Broken fork -> (the check guarding its bug, a regular expression its failure message matches).
GUARDS: dict[str, list[tuple[str, str]]] = {
    "broken_a2a_refusal_crashes": [
        ("a2a.mismatched_sizes_refused_on_every_rank", "raised TypeError, which a refusal of well-typed input is not")
    ],
    "broken_a2a_destinations_clamped": [
        ("a2a.bad_destinations_refused_on_every_rank", r"rank 0 sends a token to rank 2, .* raised nothing")
    ],
    "broken_gather_no_cross_rank_sum": [("gather.backward_sums_rank_slices", "gradient of x")],
    "broken_gather_wrong_order": [("gather.forward_matches_cat", "gathered output: values differ")],
    "broken_gather_mutates_grad": [("gather.inputs_and_grads_not_modified", "modified in place")],
    "broken_gather_reduces_grad_in_place": [("gather.inputs_and_grads_not_modified", "modified in place")],
    "broken_gather_uneven_hangs_or_garbage": [("gather.uneven_mismatch_raises_on_every_rank", "ValueError")],
    "broken_gather_forward_drops_last_rank": [("gather.forward_matches_cat", "gathered output")],
    "broken_gather_gathers_in_float32": [("gather.forward_matches_cat", "dtype")],
    "broken_gather_reduces_float64_in_float32": [
        ("gather.float_grads_within_tolerance", r"torch\.float64 values off by more than the reduction bound")
    ],
    "broken_gather_reduces_float32_in_bfloat16": [
        ("gather.float_grads_within_tolerance", r"torch\.float32 values off by more than the reduction bound")
    ],
    "broken_ddp_drops_bucket_cap": [("ddp.bucket_cap_mb", _BUCKETS.format(got=1))],
    "broken_ddp_forward_sync_buffers": [
        ("ddp.broadcast_buffers", r"broadcast_buffers=False: rank 1's buffer after init is 0, expected 1")
    ],
    "broken_ddp_no_checkpointing": [
        ("ddp.activation_checkpointing_full", r"language\.0 \(a selected trainable block\) ran attn 0x and mlp 0x"),
        ("ddp.activation_checkpointing_selective", r"activation_checkpointing='selective'.*ran attn 0x"),
    ],
    # Run in worlds of 2 and 3: it fails in 3, where the checkpointing checks check their sample of scopes.
    "broken_ddp_no_checkpointing_beyond_two_ranks": [
        (
            "ddp.activation_checkpointing_full",
            r"scope 'language,vision', rank \d: language\.0 \(a selected trainable block\) ran attn 0x and mlp 0x",
        ),
        ("ddp.activation_checkpointing_selective", r"'selective', scope 'language,vision', rank \d: .*ran attn 0x"),
    ],
    "broken_config_accepts_negative_bucket": [
        ("config.rejects_bad_values_naming_field", r"DDPConfig\(bucket_cap_mb=-1\.0\) was accepted")
    ],
    "broken_config_bool_strings": [("config.rejects_bad_values_naming_field", "was accepted")],
    # Every DDPConfig field on and off, each with a fork that gets it wrong (issue 22); and the config's own checks.
    "broken_ddp_bucket_cap_divided_by_1024": [("ddp.bucket_cap_mb", _BUCKETS.format(got=24))],
    "broken_ddp_bucket_cap_times_1024": [("ddp.bucket_cap_mb", _BUCKETS.format(got=1))],
    # Escapes the bucket check had (issue 29): a comm hook hid it; caps past a decade and None were not told apart.
    "broken_ddp_hook_hides_dropped_cap": [("ddp.bucket_cap_mb", _BUCKETS.format(got=1))],
    "broken_ddp_ignores_large_caps": [
        ("ddp.bucket_cap_mb", r"bucket_cap_mb=\d+(\.\d+)?: rank \d's DDP has a bucket cap of 26214400 bytes")
    ],
    "broken_ddp_none_is_one_mib": [
        ("ddp.bucket_cap_mb", r"bucket_cap_mb=None: rank \d's DDP has a bucket cap of 1048576 bytes, .* has 26214400")
    ],
    "broken_ddp_find_unused_forced_on": [
        ("ddp.find_unused_parameters", r"find_unused_parameters=False: rank \d trained two iterations with an unused")
    ],
    "broken_ddp_static_graph_ignored": [
        ("ddp.static_graph", r"the DDP object's static_graph is False on rank \d, expected True")
    ],
    "broken_ddp_bucket_view_forced_on": [
        ("ddp.gradient_as_bucket_view", r"gradient_as_bucket_view=False: on rank \d, step 1, param\.grad inside a")
    ],
    "broken_ddp_broadcast_buffers_forced_on": [
        ("ddp.broadcast_buffers", r"broadcast_buffers=False: rank 1's buffer after init is 0, expected 1")
    ],
    "broken_ddp_autocast_casts_model": [
        ("ddp.autocast_dtype", r"a float32 model's parameters are \['torch\.bfloat16'\] after wrapping")
    ],
    "broken_ddp_autocast_casts_output": [
        ("ddp.autocast_dtype", r"the forward's matmuls ran in \['torch\.float32'\], expected torch\.bfloat16")
    ],
    "broken_gather_x_positional_only": [
        ("gather.takes_x_by_keyword", r"all_gather_no_grad\(x=\.\.\.\) raised TypeError: .*the documented signature")
    ],
    "broken_ddp_recompute_outside_autocast": [
        ("ddp.autocast_dtype", r"CheckpointError: torch\.utils\.checkpoint: Recomputed values for the following "
                               r"tensors have different metadata")
    ],
    "broken_ddp_autocast_output_float32": [
        ("ddp.autocast_dtype", r"the wrapped forward returned torch\.float32, torch\.autocast's forward of the same "
                               r"model returns torch\.bfloat16")
    ],
    "broken_ddp_selective_is_full": [
        (
            "ddp.activation_checkpointing_selective",
            r"ran all 7 of its ops again during backward \(4 of 4 matmuls, 3 of 3 other ops computing a tensor; views "
            r"aside\); expected strictly fewer",
        )
    ],
    "broken_ddp_selective_saves_every_op": [
        (
            "ddp.activation_checkpointing_selective",
            r"language\.0 \(a selected trainable block\) ran none of its 7 ops again during backward \(0 of 4 matmuls, "
            r"0 of 3 other ops computing a tensor; views aside\); expected at least one",
        )
    ],
    "broken_ddp_discovery_takes_first_container": [
        (
            "ddp.checkpointing_follows_structural_discovery",
            r"language_model\.adapters\.0 ran attention 1x and MLP 1x during backward; expected no recompute: its "
            r"group's blocks are those of language_model\.layers",
        )
    ],
    "broken_ddp_multimodal_without_audio": [
        (
            "ddp.activation_checkpointing_full",
            r"scope 'multimodal', rank \d: audio\.0 \(a selected trainable block\) ran attn 0x and mlp 0x",
        )
    ],
    "broken_ddp_checkpoints_frozen_blocks": [
        ("ddp.activation_checkpointing_full", r"vision\.1 \(a frozen block\) ran attn 1x and mlp 1x during backward")
    ],
    "broken_config_accepts_nan_bucket": [_accepted(r"bucket_cap_mb=nan")],
    "broken_config_accepts_bool_bucket": [_accepted(r"bucket_cap_mb=True")],
    "broken_config_accepts_integer_autocast_dtype": [_accepted(r"autocast_dtype=torch\.int32")],
    "broken_config_accepts_empty_scope": [_accepted(r"activation_checkpointing_scope=' , '")],
    "broken_config_scope_list_drops_non_str": [
        ("config.scope_names_validated", r"DDPConfig\(activation_checkpointing_scope=\['language', 3\]\) was accepted")
    ],
    "broken_config_accepts_scope_before_all": [
        ("config.scope_names_validated", r"DDPConfig\(activation_checkpointing_scope='acoustic'\) was accepted")
    ],
    "broken_gather_reduces_own_slot": [("gather.backward_sums_rank_slices", "gradient of x")],
    "broken_gather_drops_own_rows": [("gather.forward_matches_cat", "gathered output")],
    "broken_gather_backward_segfaults": [
        ("gather.backward_sums_rank_slices", r"^RankFailure: rank \d crashed: killed by signal SIGSEGV")
    ],
    "broken_gather_backward_views_grad": [
        ("gather.backward_with_non_contiguous_gradients", "raised RuntimeError: view size is not compatible")
    ],
    "broken_gather_group_rank_from_first_member": [("gather.group_uses_group_ranks", "IndexError|gradient of x")],
    "broken_gather_uneven_group_global_rank": [
        ("gather.uneven_with_group_gathers_group_rows", "IndexError|invalid gradient|gradient of x")
    ],
    "broken_gather_uneven_pads_with_nan": [
        ("gather.uneven_no_grad_gathers_integers_and_bools", "value cannot be converted to type")
    ],
    # The FSDP2 component (issue 30): one fork per field, upstream's own bugs among them (3135, 3679, 2768's class).
    "broken_fsdp2_hsdp_replicas_unsynced": [
        ("fsdp2.shards_over_the_data_parallel_dims",
         r"HSDP 2x2, rank \d: \S+ has placements \['Shard\(dim=0\)'\], expected \['Replicate\(\)', 'Shard\(dim=0\)'\]"),
        ("fsdp2.trains_like_one_process", r"HSDP 2x2, sgd, 3 steps, rank \d: parameters vs one process"),
    ],
    "broken_fsdp2_sync_never_defers": [
        ("fsdp2.deferred_sync_reduces_on_the_last_micro_batch",
         r"defer_fsdp_grad_sync=True, FSDP, rank \d: parameters holding a reduced gradient after each micro-batch "
         r"\[\d+, \d+\]; expected none before the last"),
    ],
    "broken_fsdp2_mesh_dims_swapped": [
        ("fsdp2.shards_over_the_data_parallel_dims",
         r"HSDP 2x2, rank \d: \S+ is placed over ranks \[\[0, 1\], \[0, 2\]\] .*expected \[\[0, 2\], \[0, 1\]\]"),
    ],
    "broken_fsdp2_reduce_dtype_ignored": [
        ("fsdp2.default_mp_policy_bf16_compute_fp32_reduce", r"reduced in bfloat16 \(gloo:.*expected float32"),
    ],
    "broken_fsdp2_root_resharded": [("fsdp2.reshard_after_forward_chooses_units", r"differs at \[''\]")],
    "broken_fsdp2_offload_dropped": [
        ("fsdp2.cpu_offload_trains_and_offloads",
         r"offload_policy=cpu, rank \d: units' offload policies .*expected CPUOffloadPolicy on each"),
    ],
    "broken_fsdp2_cast_forward_inputs_dropped": [
        (
            "fsdp2.every_unit_holds_the_configured_policy",
            r"mp_policy=None \(the default\), rank \d: unit .* holds \{.*'cast_forward_inputs': True\}, expected "
            r"\{.*'cast_forward_inputs': False\}",
        )
    ],
    "broken_fsdp2_selective_is_full": [
        (
            "fsdp2.activation_checkpointing_recomputes_selected_layers",
            r"activation_checkpointing='selective', scope 'language', rank \d: layers\.0 \(language group, selected\) "
            r"ran all 7 of its ops again during backward",
        )
    ],
    "broken_fsdp2_checkpointing_scope_ignored": [
        ("fsdp2.activation_checkpointing_recomputes_selected_layers",
         r"scope 'vision', rank \d: layers\.0 \(language group, not selected\) ran attn [1-9]"),
    ],
    "broken_tp_chooser_ignores_explicit_plan": [
        ("tp.explicit_plan_comes_first", r"sharded over tp: lm_head\.weight, model\.embed_tokens\.weight, .*; the "
                                         r"explicit plan shards lm_head\.weight alone")
    ],
    "broken_tp_gathered_norm_keeps_shard": [
        ("tp.forward_equals_unsharded", r"tiny-llama, sequence parallel: the target raised in forward on ranks 0, 1")
    ],
    "broken_tp_sp_norms_plain": [
        ("tp.gradients_equal_unsharded", r"sequence parallel, rank \d: full gradients differ .*\n"
                                         r"  model\.layers\.0\.input_layernorm\.weight plain: off by")
    ],
    "broken_tp_embedding_partial": [
        ("tp.forward_equals_unsharded", r"tiny-llama, rank \d: logits \(DTensor \['Shard\(dim=2\)'\]\) differ")
    ],
    "broken_tp_head_untied": [("tp.tied_embeddings_stay_tied", r"the head's weight is no longer the embedding's")],
    "broken_tp_head_counts_twice": [
        ("tp.forward_equals_unsharded", r"RuntimeError: shape '\[2, 8, 2, 4\]' is invalid"),
        ("tp.attention_head_counts_are_local", r"the target raised in forward"),
    ],
}
#: Broken forks whose failures name a likely cause (world of 2), and the cause's first words.
LIKELY_CAUSES = {
    "broken_gather_forward_drops_last_rank": "rank 1's rows missing from the output",
    "broken_gather_wrong_order": "rank order reversed",
    "broken_gather_no_cross_rank_sum": "no cross-rank sum",
    "broken_gather_gathers_in_float32": "dtype changed",
    "broken_gather_reduces_own_slot": "each rank's own slot summed across ranks (the backward all-reduces only its",
    "broken_gather_drops_own_rows": "each rank's own rows are missing from its output",
    "broken_gather_reduces_float64_in_float32": "reduced in float32: gradients match a float32 reduction of float64",
    "broken_gather_reduces_float32_in_bfloat16": "reduced in bfloat16: gradients match a bfloat16 reduction of float32",
    "broken_gather_group_rank_from_first_member": "wrong only in groups of interleaved ranks",
    "broken_gather_uneven_group_global_rank": "wrong only inside a subgroup (global rank used where the group rank",
    # The checkpointing contract names the class of each checkpointing bug (ddp/checkpoint_rules.py).
    "broken_ddp_selective_is_full": "'selective' recomputes every op of the block, as full checkpointing does",
    "broken_ddp_selective_saves_every_op": "'selective' recomputes nothing",
    "broken_ddp_no_checkpointing": "a selected block is not checkpointed",
    "broken_ddp_checkpoints_frozen_blocks": "a block the scope does not select is checkpointed",
    "broken_fsdp2_selective_is_full": "'selective' recomputes every op of the block, as full checkpointing does",
    "broken_fsdp2_checkpointing_scope_ignored": "a block the scope does not select is checkpointed",
    "broken_fsdp2_cast_forward_inputs_dropped": "the MixedPrecisionPolicy rebuilt or replaced before fully_shard",
    "broken_fsdp2_reduce_dtype_ignored": "mp_policy=None not made upstream's default policy",
    "broken_tp_chooser_ignores_explicit_plan": "the plan chooser's order",
    "broken_tp_sp_norms_plain": "replicated parameters' gradients are partial per rank",
    "broken_tp_head_untied": "parallelize_module replaced the embedding's and the head's weights",
}
