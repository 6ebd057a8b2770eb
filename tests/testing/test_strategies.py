"""Layer 0: no process group. The public gather strategies keep their contracts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.conformance.suites.gather.ranks import same_bits
from nemo_dist.testing import strategies as ds


@given(data=st.data())
def test_apply_layout_keeps_values_and_breaks_contiguity_when_shape_allows(data: st.DataObject) -> None:
    """apply_layout returns equal bits, shape and dtype; non-contiguous unless a dim of 0 or 1 prevents it."""
    shape = data.draw(ds.shapes())
    dtype = data.draw(ds.all_dtypes())
    layout = data.draw(ds.layouts(shape))
    (tensor,) = data.draw(ds.rank_tensors(1, shape, dtype))
    laid = ds.apply_layout(tensor, layout)
    assert same_bits(laid, tensor)
    if layout != "contiguous" and min(shape) > 1:
        assert not laid.is_contiguous()


@given(data=st.data())
def test_rank_tensors_are_integer_valued_and_sized_per_rank(data: st.DataObject) -> None:
    """rank_tensors gives one tensor per rank with the rank's rows, integer values by default."""
    world_size = data.draw(st.integers(1, 4))
    shape = data.draw(ds.shapes())
    rows = data.draw(ds.row_counts(world_size))
    dtype = data.draw(ds.float_dtypes())
    tensors = data.draw(ds.rank_tensors(world_size, shape, dtype, rows=rows))
    assert [t.shape for t in tensors] == [torch.Size((n, *shape[1:])) for n in rows]
    for t in tensors:
        assert t.dtype == dtype
        assert torch.equal(t, t.round())


@given(data=st.data())
def test_random_rank_tensors_have_full_mantissas_and_differ_per_rank(data: st.DataObject) -> None:
    """values="random": float64 values none exact in float32, float32 ones not all exact in bfloat16, ranks differ."""
    world_size = data.draw(st.integers(2, 4))
    shape = data.draw(ds.shapes(min_rows=1))
    wide = data.draw(ds.rank_tensors(world_size, shape, torch.float64, values="random"))
    narrow = data.draw(ds.rank_tensors(world_size, shape, torch.float32, values="random"))
    assert [t.shape for t in wide] == [torch.Size(shape)] * world_size
    for t in wide:
        assert t.dtype == torch.float64
        assert not bool((t.float().double() == t).any())
    assert not all(torch.equal(t.bfloat16().float(), t) for t in narrow)
    assert not torch.equal(wide[0], wide[1])


@given(data=st.data())
def test_float_rank_tensors_are_multiples_of_1_1024_within_4(data: st.DataObject) -> None:
    """values="floats": every value a multiple of 1/1024 in [-4, 4] (exact in float64), in the asked dtype."""
    shape = data.draw(ds.shapes())
    dtype = data.draw(ds.float_dtypes())
    tensors = data.draw(ds.rank_tensors(2, shape, dtype, values="floats"))
    for t in tensors:
        assert t.dtype == dtype
        scaled = t.double() * 1024
        assert torch.equal(scaled, scaled.round())
        assert bool((t.double().abs() <= 4).all())


@pytest.mark.parametrize("values", ["random", "floats", "bits"])
@given(data=st.data())
def test_non_integer_values_need_a_float_dtype(values: ds.Values, data: st.DataObject) -> None:
    """values="random", "floats" or "bits" with an integer dtype is a ValueError naming the kind and the dtype."""
    with pytest.raises(ValueError, match=rf"values=.{values}. needs a float dtype, got torch\.int64"):
        data.draw(ds.rank_tensors(1, (2,), torch.int64, values=values))


def test_apply_layout_rejects_layout_that_does_not_apply() -> None:
    """channels_last on a 2-d tensor is a ValueError naming the layouts that apply."""
    with pytest.raises(ValueError, match=r"'channels_last' does not apply to a 2-d tensor"):
        ds.apply_layout(torch.zeros(2, 2), "channels_last")


def test_testing_package_does_not_import_strategies() -> None:
    """import nemo_dist.testing loads neither the strategies module nor hypothesis."""
    code = (
        "import sys, nemo_dist.testing; print(sorted(m for m in sys.modules if 'strategies' in m or 'hypothesis' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
