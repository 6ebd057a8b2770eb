"""Layer 2: gloo worlds of 2 and 3 ranks. Every DDPConfig field, proven by behaviour against the reference.

Each test runs one registered conformance check of ``nemo_dist.conformance.ddp_checks``
against the bundled implementation; the same checks run against forks through the
conformance command and ``test_suite_catches_broken_ddp.py``.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import REFERENCE, ddp_checks
from nemo_dist.testing import World

pytestmark = pytest.mark.world_sizes(2, 3)


def test_manager_sets_rank_device_and_mirrors_the_config_fields(dist_world: World) -> None:
    """DDPManager has rank/world_size/device and the seven config fields as attributes."""
    ddp_checks.manager_attributes(dist_world, REFERENCE)


@pytest.mark.parametrize("api", ["parallelize_ddp", "DDPManager"])
def test_both_entry_points_return_a_cpu_ddp_of_the_model(dist_world: World, api: str) -> None:
    """parallelize_ddp and DDPManager.parallelize return a DDP over the model, on CPU, device_ids None."""
    ddp_checks.parallelize_wraps_and_places(dist_world, REFERENCE.with_ddp_api(api))


def test_broadcast_buffers_true_syncs_rank0_buffers_false_never_syncs(dist_world: World) -> None:
    """broadcast_buffers=True gives all ranks rank 0's buffers; False keeps them rank-local, even at construction."""
    ddp_checks.broadcast_buffers(dist_world, REFERENCE)


def test_small_bucket_cap_gives_more_buckets_and_none_keeps_torch_default(dist_world: World) -> None:
    """bucket_cap_mb shapes DDP's buckets (seen by a comm hook on step 3); None equals plain DDP."""
    ddp_checks.bucket_cap_mb(dist_world, REFERENCE)


def test_unused_parameter_trains_when_found_and_raises_when_not(dist_world: World) -> None:
    """find_unused_parameters=True tolerates a skipped parameter; False makes DDP raise on every rank."""
    ddp_checks.find_unused_parameters(dist_world, REFERENCE)


def test_gradient_as_bucket_view_puts_grads_inside_bucket_buffers(dist_world: World) -> None:
    """gradient_as_bucket_view=True: every grad lies in a bucket buffer over 3 steps; False: none does."""
    ddp_checks.gradient_as_bucket_view(dist_world, REFERENCE)


def test_static_graph_is_recorded_and_trains_like_dynamic_graph(dist_world: World) -> None:
    """static_graph=True is set on the DDP (False by default), accepts checkpointing and an unused parameter."""
    ddp_checks.static_graph(dist_world, REFERENCE)


def test_full_checkpointing_recomputes_exactly_selected_blocks(dist_world: World) -> None:
    """Full checkpointing reruns attn/mlp of exactly the selected trainable blocks in backward, same gradients."""
    ddp_checks.activation_checkpointing_full(dist_world, REFERENCE)


def test_no_checkpointing_recomputes_no_block(dist_world: World) -> None:
    """activation_checkpointing=False reruns no attn/mlp in backward, whatever the scope."""
    ddp_checks.activation_checkpointing_off(dist_world, REFERENCE)


def test_selective_checkpointing_recomputes_exactly_selected_blocks(dist_world: World) -> None:
    """Selective checkpointing reruns attn/mlp of exactly the selected trainable blocks in backward, same gradients."""
    ddp_checks.activation_checkpointing_selective(dist_world, REFERENCE)


def test_autocast_dtype_sets_wrapped_output_dtype(dist_world: World) -> None:
    """autocast_dtype=bfloat16 gives bfloat16 outputs from a float32 model; None gives float32."""
    ddp_checks.autocast_dtype(dist_world, REFERENCE)


def test_gathered_contrastive_loss_gives_full_batch_gradient(dist_world: World) -> None:
    """InfoNCE over all_gather_with_grad embeddings under DDP equals one process on the full batch (1e-12)."""
    ddp_checks.contrastive_loss_equals_full_batch(dist_world, REFERENCE)


def test_any_valid_config_trains_like_one_process_with_identical_ranks(dist_world: World) -> None:
    """For any drawn DDPConfig, DDP training matches full-batch training and ranks stay bit-identical."""
    ddp_checks.any_config_trains_like_one_process(dist_world, REFERENCE)
