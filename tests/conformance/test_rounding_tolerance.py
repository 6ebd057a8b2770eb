"""Layer 1: the tolerance derived from a dtype's rounding, with no world.

:func:`~nemo_dist.conformance.suites.ddp.expectations.rounding_tolerance` scales a
dtype's unit roundoff by a count of roundings and the size of the values
compared; :func:`~nemo_dist.conformance.suites.ddp.expectations.assert_close_rounded`
holds tensors to it (per tensor, or on the largest value of all), and
:func:`~nemo_dist.conformance.suites.ddp.expectations.computed_in` picks the less
precise of a rank's parameter dtype and a declared compute dtype.
"""

from __future__ import annotations

import pytest
import torch

from nemo_dist.conformance.suites.ddp.expectations import (
    assert_close_rounded,
    computed_in,
    rounding_tolerance,
    unit_roundoff,
)


@pytest.mark.parametrize(
    ("dtype", "u"),
    [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11), (torch.float32, 2.0**-24)],
)
def test_unit_roundoff_is_half_the_machine_epsilon(dtype: torch.dtype, u: float) -> None:
    """One rounding to the dtype errs by at most half its epsilon, relative: 2^-8 for bfloat16."""
    assert unit_roundoff(dtype) == u
    value = torch.tensor(1.0 + 3 * u, dtype=torch.float64)
    assert abs(float(value.to(dtype)) - float(value)) <= u * float(value)


def test_rounding_tolerance_scales_with_roundings_and_value_size() -> None:
    """atol = roundings * u * scale and rtol = roundings * u, exactly."""
    tolerance = rounding_tolerance(torch.bfloat16, 32, 4.0)
    assert tolerance == {"atol": 32 * 2.0**-8 * 4.0, "rtol": 32 * 2.0**-8}


def test_a_difference_within_the_roundings_passes_and_one_beyond_fails_naming_the_derivation() -> None:
    """Per tensor: each tensor is held to its own largest entry, so a small tensor gets a small tolerance."""
    big = torch.tensor([1.0, 2.0], dtype=torch.float64)
    small = torch.tensor([0.001, 0.002], dtype=torch.float64)
    u = unit_roundoff(torch.bfloat16)
    within = [big + 8 * u * 2.0, small + 8 * u * 0.002]
    assert_close_rounded(within, [big, small], "grads", torch.bfloat16, 16, per_tensor=True)
    beyond = [big, small * 2]  # the small tensor off by 2x: within the big one's tolerance, not its own
    assert_close_rounded(beyond, [big, small], "grads", torch.bfloat16, 16, per_tensor=False)
    with pytest.raises(AssertionError, match=r"grads, tensor 1 \(tolerance derived from 16 roundings to bfloat16"):
        assert_close_rounded(beyond, [big, small], "grads", torch.bfloat16, 16, per_tensor=True)


def test_the_less_precise_of_parameters_and_declared_compute_dtype_is_the_one_computed_in() -> None:
    """A float64 model declared to compute in bfloat16 computes in bfloat16; a float32 model undeclared in float32."""
    assert computed_in("torch.float64", "bfloat16") == torch.bfloat16
    assert computed_in("torch.float32", None) == torch.float32
    assert computed_in("torch.bfloat16", "float32") == torch.bfloat16
    assert computed_in("torch.float64", None) == torch.float64
