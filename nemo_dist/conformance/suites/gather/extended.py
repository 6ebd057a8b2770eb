"""Extended-tier conformance checks of the gather component: what nemo_dist promises beyond upstream.

``uneven=True`` (of every dtype without grad), ``group=`` (of contiguous
and interleaved ranks, and with ``uneven=True``), clear errors on every
rank, and an ``all_gather_no_grad`` result that never requires grad
(upstream returns ``x`` itself when there is nothing to gather). A check of
a keyword the target does not take is NOT SUPPORTED. Checks work as the core
ones do (:mod:`~nemo_dist.conformance.suites.gather.checks`); the group checks end
with a fixed example of interleaved groups (:data:`FIXED_GROUP_EXAMPLE`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.conformance.engine.explain import add_note
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check
from nemo_dist.conformance.suites.gather import group_diagnosis, ranks
from nemo_dist.conformance.suites.gather.messages import BothGathers, Gathered
from nemo_dist.conformance.suites.gather.oracle import expected_grads
from nemo_dist.conformance.suites.gather.properties import (
    LastFailure,
    assert_same,
    diagnosed,
    draw_laid_out_inputs,
    draw_partition,
    draw_shape_and_dtype,
    error_rows,
    interleaved_partition,
    require_no_group,
)
from nemo_dist.conformance.suites.gather.target import target
from nemo_dist.testing import strategies as ds

__all__ = [
    "FIXED_GROUP_EXAMPLE",
    "group_uses_group_ranks",
    "no_grad_never_requires_grad",
    "takes_x_by_keyword",
    "uneven_gathers_rows_in_rank_order",
    "uneven_mismatch_raises_on_every_rank",
    "uneven_no_grad_gathers_integers_and_bools",
    "uneven_with_group_gathers_group_rows",
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
        results: list[BothGathers] = world.run(ranks.uneven, impl, inputs, layout, grads)
        expected_out = torch.cat(inputs)
        expected = expected_grads(grads, rows)
        for r, result in enumerate(results):
            assert_same(result.out, expected_out, f"rank {r}: all_gather_with_grad(uneven=True) output")
            assert_same(result.no_grad_out, expected_out, f"rank {r}: all_gather_no_grad(uneven=True) output")
            assert not result.no_grad_requires_grad, f"rank {r}: all_gather_no_grad(uneven=True) output requires grad"
            assert_same(result.grad, expected[r], f"rank {r}: gradient of x with uneven=True (rows {rows})")

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


#: The dtypes only the no-grad gather moves (integers and bool).
_NOT_FLOAT = tuple(d for d in ds.ALL_DTYPES if not d.is_floating_point)

#: What the group checks' fixed example is, as its failure shows it.
FIXED_GROUP_EXAMPLE = (
    "Fixed example (run after hypothesis's examples, which missed this failure): the world split into its even "
    "and its odd ranks ({groups}), float32 inputs{rows}, upstream gradients of positive integers differing "
    "between members: a member's group rank is its position in its group, not its global rank minus the first "
    "member's"
)


def _group_grads(
    data: st.DataObject, partition: Sequence[Sequence[int]], rows: Sequence[int], shape: tuple[int, ...],
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """Draw every rank's upstream gradient for its group's gathered output, indexed by global rank."""
    grads: list[torch.Tensor] = [torch.empty(0)] * len(rows)
    for members in partition:
        out_shape = (sum(rows[m] for m in members), *shape[1:])
        drawn = data.draw(ds.upstream_grads(len(members), out_shape, dtype), label=f"grads of {list(members)}")
        for position, r in enumerate(members):
            grads[r] = drawn[position]
    return grads


def _assert_grouped(
    world: WorldLike,
    impl: Implementation,
    last: LastFailure,
    partition: Sequence[Sequence[int]],
    inputs: list[torch.Tensor],
    grads: list[torch.Tensor],
    uneven: bool,
) -> None:
    """Gather over each rank's group of ``partition``; assert output and gradient follow the group's ranks."""
    rows = [t.shape[0] for t in inputs]
    shape, dtype = (max(rows), *inputs[0].shape[1:]), inputs[0].dtype
    with last.record(shape=shape, dtype=dtype, partition=[list(m) for m in partition]):
        results: list[BothGathers] = world.run(ranks.grouped, impl, inputs, grads, partition, uneven=uneven)
        for members in partition:
            expected_out = torch.cat([inputs[m] for m in members])
            expected = expected_grads([grads[m] for m in members], [rows[m] for m in members])
            for position, r in enumerate(members):
                where = f"rank {r} (group rank {position} of {list(members)}" + (f", rows {rows})" if uneven else ")")
                assert_same(results[r].out, expected_out, f"{where}: gathered output")
                assert_same(results[r].no_grad_out, expected_out, f"{where}: no-grad gathered output")
                assert_same(results[r].grad, expected[position], f"{where}: gradient of x")


def _then_interleaved(
    prop: Callable[[], None], world: WorldLike, impl: Implementation, last: LastFailure, uneven: bool
) -> Callable[[], None]:
    """``prop``, then one fixed example over the even and the odd ranks (:data:`FIXED_GROUP_EXAMPLE`).

    With ``uneven`` rank r has ``r + 1`` rows. Hypothesis may draw only
    contiguous groups in a few examples; in these, a group rank computed as
    the global rank minus the group's first member is right. It runs only
    when hypothesis found nothing, so a failure it found keeps its shrunk example.
    """

    def run() -> None:
        prop()
        partition = interleaved_partition(world.size)
        rows = [r + 1 if uneven else 2 for r in range(world.size)]
        inputs = [torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 100 * r for r, n in enumerate(rows)]
        grads: list[torch.Tensor] = [torch.empty(0)] * world.size
        for members in partition:
            total = sum(rows[m] for m in members)
            pattern = (torch.arange(total * 3, dtype=torch.float32) % 5 + 1).reshape(total, 3)
            for position, r in enumerate(members):
                grads[r] = pattern * (position + 1)
        try:
            _assert_grouped(world, impl, last, partition, inputs, grads, uneven)
        except AssertionError as exc:
            groups = " and ".join("{" + ", ".join(map(str, m)) + "}" for m in partition)
            add_note(exc, FIXED_GROUP_EXAMPLE.format(groups=groups, rows=f" of rows {rows}" if uneven else ""))
            raise

    return run


@check("gather.group_uses_group_ranks", tier="extended", component="gather", min_world=3)
def group_uses_group_ranks(world: WorldLike, impl: Implementation) -> None:
    """With group=, output and gradient follow the group's ranks and size (two groups, contiguous or interleaved)."""
    target(impl).require("group")
    last = LastFailure()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        partition = draw_partition(data, world.size)
        shape, dtype = draw_shape_and_dtype(data, ds.float_dtypes())
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype), label="inputs")
        grads = _group_grads(data, partition, [shape[0]] * world.size, shape, dtype)
        _assert_grouped(world, impl, last, partition, inputs, grads, uneven=False)

    fixed = _then_interleaved(prop, world, impl, last, uneven=False)
    diagnosed(fixed, last, lambda example: group_diagnosis.group_cause(world, impl, example))


@check("gather.uneven_with_group_gathers_group_rows", tier="extended", component="gather", min_world=3)
def uneven_with_group_gathers_group_rows(world: WorldLike, impl: Implementation) -> None:
    """uneven=True with group=: each group gathers its members' differing rows in group order, gradients too."""
    gather = target(impl)
    gather.require("group")
    gather.require("uneven")
    last = LastFailure()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        partition = draw_partition(data, world.size)
        shape, dtype = draw_shape_and_dtype(data, ds.float_dtypes())
        rows = data.draw(ds.row_counts(world.size), label="rows")
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype, rows=rows), label="inputs")
        grads = _group_grads(data, partition, rows, shape, dtype)
        _assert_grouped(world, impl, last, partition, inputs, grads, uneven=True)

    fixed = _then_interleaved(prop, world, impl, last, uneven=True)
    diagnosed(fixed, last, lambda example: group_diagnosis.uneven_group_cause(world, impl, example))


@check("gather.uneven_no_grad_gathers_integers_and_bools", tier="extended", component="gather")
def uneven_no_grad_gathers_integers_and_bools(world: WorldLike, impl: Implementation) -> None:
    """The no-grad gather with uneven=True of integer and bool tensors: every rank's rows in order, dtype kept."""
    target(impl).require("uneven")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        shape, dtype = draw_shape_and_dtype(data, st.sampled_from(_NOT_FLOAT))
        rows = data.draw(ds.row_counts(world.size), label="rows")
        if world.size > 1 and len(set(rows)) == 1:
            rows = [*rows[:-1], rows[-1] + 1]  # rows that differ: the uneven path, not the equal-shape one
        layout = data.draw(ds.layouts(shape), label="layout")
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype, rows=rows), label="inputs")
        results: list[Gathered] = world.run(
            ranks.forward, impl, inputs, layout, no_grad=True, requires_grad=False, uneven=True
        )
        expected = torch.cat(inputs)
        for r, result in enumerate(results):
            assert_same(result.out, expected, f"rank {r}: all_gather_no_grad(uneven=True) of {dtype} (rows {rows})")
            assert result.input_intact, f"rank {r}: the no-grad gather modified the caller's input in place"

    prop()


@check("gather.no_grad_never_requires_grad", tier="extended", component="gather")
def no_grad_never_requires_grad(world: WorldLike, impl: Implementation) -> None:
    """The no-grad gather of an x that requires grad never requires grad, in a world of one too."""

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        _, _, layout, inputs = draw_laid_out_inputs(data, world, ds.float_dtypes())
        results: list[Gathered] = world.run(ranks.forward, impl, inputs, layout, no_grad=True, requires_grad=True)
        for r, result in enumerate(results):
            assert not result.requires_grad, (
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


@check("gather.takes_x_by_keyword", tier="extended", component="gather", needs_world=False)
def takes_x_by_keyword(world: None, impl: Implementation) -> None:
    """Both functions take their input as ``x=``, as the documented signatures name it (``all_gather_no_grad(x)``).

    Run without a process group (each returns what it was given): a caller
    writing ``all_gather_no_grad(x=t)`` must not meet a TypeError.
    """
    target(impl).require_module("the documented signature all_gather_*(x)")
    require_no_group()
    module = impl.module("gather")
    x = torch.arange(6.0).reshape(2, 3)
    for name in ("all_gather_with_grad", "all_gather_no_grad"):
        try:
            out = getattr(module, name)(x=x)
        except TypeError as error:
            raise AssertionError(
                f"{name}(x=...) raised TypeError: {error}; the documented signature is {name}(x), so x may be "
                "passed by keyword (a positional-only or renamed parameter breaks such callers)"
            ) from None
        assert torch.equal(out, x), f"without a process group, {name}(x=x) returned {out.tolist()}, not x's values"


@check("gather.zero_dim_raises_on_every_rank", tier="extended", component="gather")
def zero_dim_raises_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """A 0-d input raises ValueError on every rank, with and without grad.

    The message shows what each rank's call itself raised or returned, never
    an error of the checker's own combining of a returned tuple or stack.
    """
    for function in ("with_grad", "no_grad"):
        inputs = [torch.tensor(float(r)) for r in range(world.size)]
        results = world.run(ranks.raises, impl, inputs, function)
        for r, (kind, _) in enumerate(results):
            assert kind == "ValueError", (
                f"rank {r}: {_called(impl, function)} of a 0-d tensor should raise ValueError; "
                f"each rank's call:\n{error_rows(results)}"
            )


def _called(impl: Implementation, function: str) -> str:
    """The gather ``function`` ("with_grad" or "no_grad") calls, as messages name it."""
    gather = target(impl)
    if gather.module_api:
        return f"all_gather_{function}"
    if function == "with_grad":
        return gather.label
    return impl.no_grad_fn or f"{gather.label} under torch.no_grad()"
