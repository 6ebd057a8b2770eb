"""Extended-tier conformance checks of the gather component: what nemo_dist promises beyond upstream.

``uneven=True``, ``group=``, clear errors on every rank, and an
``all_gather_no_grad`` result that never requires grad (upstream returns
``x`` itself when there is nothing to gather). A check of a keyword the
target does not take is NOT SUPPORTED. Checks work as the core ones do
(:mod:`~nemo_dist.conformance.gather.checks`).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.conformance.gather import diagnosis, ranks
from nemo_dist.conformance.gather.oracle import expected_grads
from nemo_dist.conformance.gather.properties import (
    LastFailure,
    assert_same,
    diagnosed,
    draw_laid_out_inputs,
    draw_shape_and_dtype,
    error_rows,
    require_no_group,
)
from nemo_dist.conformance.gather.target import target
from nemo_dist.conformance.registry import WorldLike, check
from nemo_dist.conformance.target import Implementation
from nemo_dist.testing import strategies as ds

__all__ = [
    "group_uses_group_ranks",
    "no_grad_never_requires_grad",
    "uneven_gathers_rows_in_rank_order",
    "uneven_mismatch_raises_on_every_rank",
    "uninitialised_no_grad_never_requires_grad",
    "zero_dim_raises_on_every_rank",
]


@check("gather.uneven_gathers_rows_in_rank_order", tier="extended", component="gather")
def uneven_gathers_rows_in_rank_order(world: WorldLike, impl: Implementation) -> None:
    """uneven=True gathers differing row counts in rank order; backward returns each rank its rows' sum."""
    target(impl).require("uneven")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        shape, dtype = draw_shape_and_dtype(data, ds.float_dtypes())
        rows = data.draw(ds.row_counts(world.size), label="rows")
        layout = data.draw(ds.layouts(shape), label="layout")
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype, rows=rows), label="inputs")
        out_shape = (sum(rows), *shape[1:])
        grads = data.draw(ds.upstream_grads(world.size, out_shape, dtype), label="upstream grads")
        results = world.run(ranks.uneven, impl, inputs, layout, grads)
        expected_out = torch.cat(inputs)
        expected = expected_grads(grads, rows)
        for r, result in enumerate(results):
            assert_same(result["out"], expected_out, f"rank {r}: all_gather_with_grad(uneven=True) output")
            assert_same(result["no_grad_out"], expected_out, f"rank {r}: all_gather_no_grad(uneven=True) output")
            assert not result["no_grad_rg"], f"rank {r}: all_gather_no_grad(uneven=True) output requires grad"
            assert_same(result["grad"], expected[r], f"rank {r}: gradient of x with uneven=True (rows {rows})")

    prop()


@check("gather.uneven_mismatch_raises_on_every_rank", tier="extended", component="gather", min_world=2)
def uneven_mismatch_raises_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """uneven=True with differing trailing dims or dtypes raises ValueError naming the ranks, on every rank."""
    target(impl).require("uneven")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        ndim = data.draw(st.integers(2, 3), label="ndim")
        rows = data.draw(ds.row_counts(world.size), label="rows")
        odd = data.draw(st.integers(0, world.size - 1), label="odd rank")
        what = data.draw(st.sampled_from(["trailing dims", "dtype"]), label="mismatch")
        trailing = (2,) * (ndim - 1)
        inputs = []
        for r, n in enumerate(rows):
            dtype = torch.float64 if what == "dtype" and r == odd else torch.float32
            shape = (n, *trailing[:-1], 3) if what == "trailing dims" and r == odd else (n, *trailing)
            inputs.append(torch.zeros(shape, dtype=dtype))
        function = data.draw(st.sampled_from(["with_grad", "no_grad"]), label="function")
        results = world.run(ranks.raises, impl, inputs, function, uneven=True)
        for r, (kind, message) in enumerate(results):
            assert (kind, "rank" in message) == ("ValueError", True), (
                f"rank {r}: expected ValueError naming the ranks for differing {what} "
                f"(rank {odd} differs); each rank got:\n{error_rows(results)}"
            )

    prop()


@check("gather.group_uses_group_ranks", tier="extended", component="gather", min_world=3)
def group_uses_group_ranks(world: WorldLike, impl: Implementation) -> None:
    """With group=, output and gradient follow the group's ranks and size (world split in two groups)."""
    target(impl).require("group")
    last = LastFailure()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        split = data.draw(st.integers(1, world.size - 1), label="first group size")
        partition = [list(range(split)), list(range(split, world.size))]
        shape, dtype = draw_shape_and_dtype(data, ds.float_dtypes())
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype), label="inputs")
        grads: list[torch.Tensor] = []
        for members in partition:
            out_shape = (len(members) * shape[0], *shape[1:])
            grads += data.draw(ds.upstream_grads(len(members), out_shape, dtype), label=f"grads of {members}")
        with last.record(shape=shape, dtype=dtype, partition=partition):
            results = world.run(ranks.grouped, impl, inputs, grads, partition)
            for members in partition:
                expected_out = torch.cat([inputs[m] for m in members])
                expected = expected_grads([grads[m] for m in members], [shape[0]] * len(members))
                for position, r in enumerate(members):
                    where = f"rank {r} (group rank {position} of {members})"
                    assert_same(results[r]["out"], expected_out, f"{where}: gathered output")
                    assert_same(results[r]["no_grad_out"], expected_out, f"{where}: no-grad gathered output")
                    assert_same(results[r]["grad"], expected[position], f"{where}: gradient of x")

    diagnosed(prop, last, lambda example: diagnosis.group_cause(world, impl, example))


@check("gather.no_grad_never_requires_grad", tier="extended", component="gather")
def no_grad_never_requires_grad(world: WorldLike, impl: Implementation) -> None:
    """The no-grad gather of an x that requires grad never requires grad, in a world of one too."""

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        _, _, layout, inputs = draw_laid_out_inputs(data, world, ds.float_dtypes())
        results = world.run(ranks.forward, impl, inputs, layout, no_grad=True, requires_grad=True)
        for r, result in enumerate(results):
            assert not result["requires_grad"], (
                f"rank {r} of {world.size}: the no-grad gather of an x that requires grad requires grad "
                + ("(x itself returned?)" if world.size == 1 else "")
            )

    prop()


@check("gather.uninitialised_no_grad_never_requires_grad", tier="extended", component="gather", needs_world=False)
def uninitialised_no_grad_never_requires_grad(world: None, impl: Implementation) -> None:
    """Without a process group, all_gather_no_grad(x) of an x that requires grad does not require grad."""
    target(impl).require_module("all_gather_no_grad without a process group")
    require_no_group()
    x = torch.arange(6.0).reshape(2, 3).requires_grad_()
    out = impl.module("gather").all_gather_no_grad(x)
    assert not out.requires_grad, "without a process group, all_gather_no_grad(x) requires grad (x itself returned?)"


@check("gather.zero_dim_raises_on_every_rank", tier="extended", component="gather")
def zero_dim_raises_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """A 0-d input raises ValueError on every rank, with and without grad."""
    for function in ("with_grad", "no_grad"):
        inputs = [torch.tensor(float(r)) for r in range(world.size)]
        results = world.run(ranks.raises, impl, inputs, function)
        for r, (kind, _) in enumerate(results):
            assert kind == "ValueError", (
                f"rank {r}: all_gather_{function} of a 0-d tensor should raise ValueError; "
                f"each rank got:\n{error_rows(results)}"
            )
