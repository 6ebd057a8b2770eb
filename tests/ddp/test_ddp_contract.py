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


def test_manager_sets_rank_device_mirrors_fields_and_wraps_in_cpu_ddp(dist_world: World) -> None:
    """DDPManager has rank/world_size/device, the seven config fields, and returns a CPU DDP of the model."""
    ddp_checks.manager_basics(dist_world, REFERENCE)


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
    """static_graph=True is set on the DDP, accepts checkpointing and an unused parameter, trains as without it."""
    ddp_checks.static_graph(dist_world, REFERENCE)


def test_full_checkpointing_recomputes_exactly_selected_blocks(dist_world: World) -> None:
    """Full checkpointing reruns attn/mlp of exactly the selected trainable blocks in backward, same gradients."""
    ddp_checks.activation_checkpointing_full(dist_world, REFERENCE)


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
