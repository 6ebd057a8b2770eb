"""Layer 2: gloo worlds of 1-4 ranks. The gather conformance checks against the bundled reference.

One thin test per registered check of :mod:`nemo_dist.conformance.gather_checks`;
the check draws its examples with hypothesis (the loaded profile) and runs them
in the session's persistent world.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import gather_checks
from nemo_dist.conformance._impl import REFERENCE
from nemo_dist.testing import World


def test_forward_returns_cat_of_rank_inputs_bit_exact(dist_world: World) -> None:
    """all_gather_with_grad returns cat of every rank's input in rank order, bit for bit, on every rank."""
    gather_checks.forward_matches_cat(dist_world, REFERENCE)


def test_no_grad_returns_same_cat_for_every_dtype_without_grad(dist_world: World) -> None:
    """all_gather_no_grad moves floats, ints and bool exactly and never requires grad."""
    gather_checks.no_grad_matches_cat_without_grad(dist_world, REFERENCE)


def test_backward_returns_sum_of_rank_slices(dist_world: World) -> None:
    """x.grad on rank r is the sum over ranks of their upstream gradient rows for rank r."""
    gather_checks.backward_sums_rank_slices(dist_world, REFERENCE)


def test_backward_rule_holds_for_sum_repeated_and_partial_losses(dist_world: World) -> None:
    """The gradient rule holds for out.sum(), an output used twice and a loss on a prefix of rows."""
    gather_checks.backward_handles_sum_repeated_and_partial_losses(dist_world, REFERENCE)


def test_float_grads_match_float64_sum_within_stated_tolerance(dist_world: World) -> None:
    """Non-integer gradients sum to the float64 reference within W * eps * sum|g| per element."""
    gather_checks.float_grads_within_tolerance(dist_world, REFERENCE)


def test_input_and_upstream_grad_are_not_modified_in_place(dist_world: World) -> None:
    """Forward and backward leave the caller's input and the gradient passed to backward unchanged."""
    gather_checks.inputs_and_grads_not_modified(dist_world, REFERENCE)


def test_autograd_function_returns_tuple_in_rank_order(dist_world: World) -> None:
    """_AllGatherWithGrad.apply returns W tensors in rank order and backward follows the rule."""
    gather_checks.autograd_function_returns_rank_tuple(dist_world, REFERENCE)


def test_uneven_gathers_differing_rows_in_rank_order(dist_world: World) -> None:
    """uneven=True gathers per-rank row counts (zero too) in order, forward and backward, exactly."""
    gather_checks.uneven_gathers_rows_in_rank_order(dist_world, REFERENCE)


@pytest.mark.world_sizes(2, 3, 4)
def test_uneven_mismatch_raises_value_error_on_every_rank(dist_world: World) -> None:
    """uneven=True with differing trailing dims or dtype raises ValueError naming the ranks on every rank."""
    gather_checks.uneven_mismatch_raises_on_every_rank(dist_world, REFERENCE)


@pytest.mark.world_sizes(3, 4)
def test_group_gathers_over_group_ranks_only(dist_world: World) -> None:
    """With group=, output and gradient use the group's ranks and size."""
    gather_checks.group_uses_group_ranks(dist_world, REFERENCE)


@pytest.mark.world_sizes(1)
def test_world_of_one_returns_input_itself(dist_world: World) -> None:
    """In a world of one rank, all_gather_with_grad returns x itself."""
    gather_checks.single_rank_returns_input(dist_world, REFERENCE)


def test_zero_dim_input_raises_value_error_on_every_rank(dist_world: World) -> None:
    """A 0-d input raises ValueError on every rank."""
    gather_checks.zero_dim_raises_on_every_rank(dist_world, REFERENCE)


def test_without_process_group_returns_input_itself() -> None:
    """In a process with no process group, all_gather_with_grad returns x itself."""
    gather_checks.uninitialised_returns_input(None, REFERENCE)  # type: ignore[arg-type]
