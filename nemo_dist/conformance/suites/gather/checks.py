"""Core-tier conformance checks of the gather component (docs/contract.md, ``dist_utils``).

Core is exactly what upstream (nemo-automodel 0.7.0) does: forward and
backward of the gather rule with equal shapes, nothing the caller owns
modified, ``x`` itself returned when there is nothing to gather (no process
group, or a world of one) and, in a larger world, a no-grad result outside
autograd. The extended tier is in :mod:`~nemo_dist.conformance.suites.gather.extended`.

Each check is registered with :func:`~nemo_dist.conformance.engine.registry.check`
and is a callable ``check(world, impl)``: it draws small inputs with
hypothesis in this (parent) process, runs a rank function of
:mod:`nemo_dist.conformance.suites.gather.ranks` on every rank of ``world`` and asserts
on the per-rank results, so a failure shrinks to a minimal example. Hypothesis
settings are the loaded profile's. Integer-valued data makes every sum exact,
so results are compared bit for bit; the precision check draws full-mantissa
random values of every float dtype and holds the gradient to the bound of
:mod:`~nemo_dist.conformance.suites.gather.precision`.

The target may be a dist_utils module or one callable (``--gather-fn``);
checks of a module-only promise are not applicable to a callable. A failing
gradient or forward check re-runs its shrunk example in variants and attaches
the likely cause (:mod:`~nemo_dist.conformance.suites.gather.diagnosis`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.explain import add_note
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check
from nemo_dist.conformance.suites.gather import diagnosis, ranks
from nemo_dist.conformance.suites.gather.messages import Alone, AutogradParts, BackwardRun, Gathered, PrecisionRun
from nemo_dist.conformance.suites.gather.oracle import expected_grads, upstream_for_loss
from nemo_dist.conformance.suites.gather.precision import exact_grads, reduction_bound, worst_error
from nemo_dist.conformance.suites.gather.properties import (
    LastFailure,
    assert_same,
    diagnosed,
    draw_laid_out_inputs,
    draw_shape_and_dtype,
    draw_upstream_grads,
    require_no_group,
)
from nemo_dist.conformance.suites.gather.target import target
from nemo_dist.testing import strategies as ds

__all__ = [
    "FIXED_BACKWARD_EXAMPLE",
    "FIXED_IN_PLACE_EXAMPLE",
    "autograd_function_returns_rank_tuple",
    "backward_handles_sum_repeated_and_partial_losses",
    "backward_sums_rank_slices",
    "backward_with_non_contiguous_gradients",
    "float_grads_within_tolerance",
    "forward_matches_cat",
    "inputs_and_grads_not_modified",
    "no_grad_matches_cat_without_grad",
    "single_rank_returns_input",
    "uninitialised_returns_input",
]


def _forward_property(world: WorldLike, impl: Implementation, *, no_grad: bool) -> None:
    """Forward = cat of every rank's input, bit-exact, input intact; ``requires_grad`` as each variant promises.

    With grad: float dtypes with any bit pattern, output ``requires_grad``
    following the input's. Without: every dtype (ints, bool), and in a world
    of 2+ ranks an output outside autograd (upstream returns ``x`` itself in a
    world of one, so there its ``requires_grad`` is ``x``'s: extended tier).
    """
    last = LastFailure()
    what = "no-grad gathered output" if no_grad else "gathered output"
    gather = "the no-grad gather" if no_grad else "the gather"

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        if no_grad:
            _, dtype, layout, inputs = draw_laid_out_inputs(data, world, ds.all_dtypes())
            requires_grad = dtype.is_floating_point and data.draw(st.booleans(), label="requires_grad")
        else:
            _, dtype, layout, inputs = draw_laid_out_inputs(data, world, ds.float_dtypes(), values="bits")
            requires_grad = data.draw(st.booleans(), label="requires_grad")
        outputs: list[Any] = []
        with last.record(dtype=dtype, layout=layout, inputs=inputs, no_grad=no_grad, outputs=outputs):
            results: list[Gathered] = world.run(
                ranks.forward, impl, inputs, layout, no_grad=no_grad, requires_grad=requires_grad
            )
            outputs.extend(result.out for result in results)
            expected = torch.cat(inputs)
            for r, result in enumerate(results):
                assert_same(result.out, expected, f"rank {r}: {what}")
                assert result.input_intact, f"rank {r}: {gather} modified the caller's input in place"
                if not no_grad:
                    assert result.requires_grad == requires_grad, (
                        f"rank {r}: output requires_grad is {result.requires_grad} for an input with "
                        f"requires_grad={requires_grad}"
                    )
                elif world.size > 1:
                    assert not result.requires_grad, f"rank {r}: the no-grad gather's output requires grad"

    diagnosed(prop, last, lambda example: diagnosis.forward_cause(world, impl, example))


@check("gather.forward_matches_cat", tier="core", component="gather")
def forward_matches_cat(world: WorldLike, impl: Implementation) -> None:
    """all_gather_with_grad returns cat of every rank's input in rank order, bit-exact, dtype kept."""
    _forward_property(world, impl, no_grad=False)


@check("gather.no_grad_matches_cat_without_grad", tier="core", component="gather")
def no_grad_matches_cat_without_grad(world: WorldLike, impl: Implementation) -> None:
    """The no-grad gather returns the same cat for every dtype (ints, bool); with 2+ ranks it needs no grad."""
    _forward_property(world, impl, no_grad=True)


def _check_backward(
    world: WorldLike, impl: Implementation, data: st.DataObject, loss: str, last: LastFailure
) -> None:
    shape, dtype, layout, inputs = draw_laid_out_inputs(data, world, ds.float_dtypes())
    out_shape, grads, grad_layout = draw_upstream_grads(data, world, shape, dtype)
    prefix = data.draw(st.integers(0, out_shape[0]), label="prefix") if loss == "prefix" else 0
    _assert_backward(world, impl, last, shape, dtype, layout, inputs, grads, grad_layout, loss, prefix)


def _assert_backward(
    world: WorldLike,
    impl: Implementation,
    last: LastFailure,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    layout: str,
    inputs: list[torch.Tensor],
    grads: list[torch.Tensor],
    grad_layout: str,
    loss: str,
    prefix: int = 0,
) -> None:
    """Run one backward example on every rank; assert the gradient rule bit for bit (recorded for the diagnosis)."""
    example = {"shape": shape, "dtype": dtype, "layout": layout, "inputs": inputs, "grads": grads,
               "grad_layout": grad_layout, "loss": loss, "prefix": prefix}
    out_shape = (world.size * shape[0], *shape[1:])
    with last.record(**example):
        results: list[BackwardRun] = world.run(ranks.backward, impl, inputs, layout, grads, grad_layout, loss, prefix)
        expected = expected_grads(upstream_for_loss(grads, loss, prefix, out_shape, dtype), [shape[0]] * world.size)
        for r, result in enumerate(results):
            assert_same(
                result.grad,
                expected[r],
                f"rank {r}: gradient of x for loss {loss!r} (expected: the sum over ranks of their "
                f"upstream gradient rows {r * shape[0]}..{(r + 1) * shape[0] - 1})",
            )


def _backward_property(world: WorldLike, impl: Implementation, losses: list[str]) -> None:
    last = LastFailure()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        _check_backward(world, impl, data, data.draw(st.sampled_from(losses), label="loss"), last)

    fixed = _then_fixed_backward(prop, world, impl, last, losses[0], "contiguous")
    diagnosed(fixed, last, lambda example: diagnosis.backward_cause(world, impl, example))


#: What the gradient checks' fixed example is, as its failure shows it.
FIXED_BACKWARD_EXAMPLE = (
    "Fixed example (run after hypothesis's examples, which missed this failure): float32 inputs of shape (2, 3), "
    "each rank's upstream gradient of positive integers differing between ranks, stored {grad_layout}, loss "
    "{loss!r}: any other combination of the ranks' gradient rows than the rule's changes the result"
)


def _then_fixed_backward(
    prop: Callable[[], None], world: WorldLike, impl: Implementation, last: LastFailure, loss: str, grad_layout: str
) -> Callable[[], None]:
    """``prop``, then one fixed example of the gradient rule (:data:`FIXED_BACKWARD_EXAMPLE`).

    Hypothesis's first examples are its simplest (zero gradients, one rank's
    row set), which some wrong reductions get right: with a few examples
    (``--max-examples 3``) a wrong gradient could pass. The fixed example,
    where every rank's gradient differs and has no zero, catches every
    reduction other than the rule's, whatever hypothesis drew; it runs only
    when hypothesis found nothing, so a failure it found keeps its shrunk example.
    """

    def run() -> None:
        prop()
        inputs, grads = _fixed_rank_example(world.size)
        try:
            _assert_backward(world, impl, last, (2, 3), torch.float32, "contiguous", inputs, grads, grad_layout, loss)
        except AssertionError as exc:
            add_note(exc, FIXED_BACKWARD_EXAMPLE.format(grad_layout=grad_layout, loss=loss))
            raise

    return run


@check("gather.backward_sums_rank_slices", tier="core", component="gather")
def backward_sums_rank_slices(world: WorldLike, impl: Implementation) -> None:
    """The gradient of x on rank r is the sum over ranks of their upstream rows for rank r, exactly."""
    _backward_property(world, impl, ["direct", "weighted"])


@check("gather.backward_handles_sum_repeated_and_partial_losses", tier="core", component="gather")
def backward_handles_sum_repeated_and_partial_losses(world: WorldLike, impl: Implementation) -> None:
    """The gradient rule holds for out.sum(), an output used twice and a loss on some rows only."""
    _backward_property(world, impl, ["sum", "twice", "prefix"])


@check("gather.backward_with_non_contiguous_gradients", tier="core", component="gather")
def backward_with_non_contiguous_gradients(world: WorldLike, impl: Implementation) -> None:
    """An upstream gradient stored transposed, strided or channels-last gives the same gradient rule, exactly.

    Every example has rows and trailing dims of 2 or more, so the layout
    really changes the memory order (the other backward checks draw
    contiguous layouts too, and shapes where a layout changes nothing).
    """
    last = LastFailure()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        trailing = data.draw(st.lists(st.integers(2, 3), min_size=1, max_size=3), label="trailing dims")
        shape = (data.draw(st.integers(1, 3), label="rows"), *trailing)
        dtype = data.draw(ds.float_dtypes(), label="dtype")
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype), label="inputs")
        out_shape = (world.size * shape[0], *shape[1:])
        grads = data.draw(ds.upstream_grads(world.size, out_shape, dtype), label="upstream grads")
        laid_out = [name for name in ds.LAYOUTS if name != "contiguous" and ds.applies(name, out_shape)]
        grad_layout = data.draw(st.sampled_from(laid_out), label="grad_layout")
        _assert_backward(world, impl, last, shape, dtype, "contiguous", inputs, grads, grad_layout, "direct")

    fixed = _then_fixed_backward(prop, world, impl, last, "direct", "transposed")
    diagnosed(fixed, last, lambda example: diagnosis.backward_cause(world, impl, example))


def _assert_precision(
    world: WorldLike,
    last: LastFailure,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    inputs: list[torch.Tensor],
    grads: list[torch.Tensor],
    results: Sequence[PrecisionRun],
) -> None:
    """Forward bit-exact, x.grad within :func:`reduction_bound` of the exact sum, for one dtype's random example."""
    outputs = [result.out for result in results]
    got = [result.grad for result in results]
    example = {"shape": shape, "dtype": dtype, "layout": "contiguous", "inputs": inputs, "grads": grads,
               "grad_layout": "contiguous", "loss": "direct", "no_grad": False, "outputs": outputs, "got": got,
               "part": "forward"}
    with last.record(**example):
        expected = torch.cat(inputs)
        for r, out in enumerate(outputs):
            assert_same(out, expected, f"rank {r}: gathered output of full-mantissa random {dtype} values")
    example["part"] = "backward"
    with last.record(**example):
        rows = [shape[0]] * world.size
        exact = exact_grads(grads, rows)
        bounds = reduction_bound(grads, rows, dtype)
        for r, grad in enumerate(got):
            wanted = f"a {dtype} tensor of shape {tuple(exact[r].shape)}"
            assert isinstance(grad, torch.Tensor), f"rank {r}: gradient {grad!r}, expected {wanted}"
            assert grad.dtype == dtype, f"rank {r}: gradient of dtype {grad.dtype}, expected {wanted}"
            assert grad.shape == exact[r].shape, f"rank {r}: gradient of shape {tuple(grad.shape)}, expected {wanted}"
        tensors = [grad for grad in got if isinstance(grad, torch.Tensor)]  # every one, as just asserted
        if all(bool(((g.double() - e).abs() <= b).all()) for g, e, b in zip(tensors, exact, bounds, strict=True)):
            return
        r, error, bound = worst_error(tensors, exact, bounds)
        raise AssertionError(
            f"rank {r}: gradient of full-mantissa random {dtype} values off by more than the reduction bound "
            f"W * eps * sum|g| (error {error:.2g}, bound {bound:.2g})\n"
            f"got\n{tensors[r]}\nexact sum (float64)\n{exact[r]}\nerror\n{(tensors[r].double() - exact[r]).abs()}\n"
            f"bound\n{bounds[r]}"
        )


@check("gather.float_grads_within_tolerance", tier="core", component="gather")
def float_grads_within_tolerance(world: WorldLike, impl: Implementation) -> None:
    """On full-mantissa random values of every float dtype, forward is bit-exact and x.grad within the reduction bound.

    Each example draws a shape (1+ rows) and, for each of float32, float64,
    float16 and bfloat16, random inputs and upstream gradients (``values=
    "random"``); one step runs the four, so half the profile's examples (at
    least 3) are run. x.grad must be the exact sum of the gradient rule within
    :func:`~nemo_dist.conformance.suites.gather.precision.reduction_bound` (``W * eps
    * sum|g|`` per element), so a gather that reduces in a lower precision
    fails, and its likely cause names it.
    """
    last = LastFailure()

    @settings(max_examples=max(3, settings().max_examples // 2))
    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        shape = data.draw(ds.shapes(min_rows=1), label="shape")
        out_shape = (world.size * shape[0], *shape[1:])
        examples = []
        for dtype in ds.FLOAT_DTYPES:
            inputs = data.draw(ds.rank_tensors(world.size, shape, dtype, values="random"), label=f"{dtype} inputs")
            grads = data.draw(
                ds.upstream_grads(world.size, out_shape, dtype, values="random"), label=f"{dtype} upstream grads"
            )
            examples.append((inputs, grads))
        results: list[list[PrecisionRun]] = world.run(ranks.precision, impl, examples)
        for d, (dtype, (inputs, grads)) in enumerate(zip(ds.FLOAT_DTYPES, examples, strict=True)):
            _assert_precision(world, last, shape, dtype, inputs, grads, [per_rank[d] for per_rank in results])

    diagnosed(prop, last, lambda example: diagnosis.precision_cause(world, impl, example))


def _assert_not_modified(
    world: WorldLike,
    impl: Implementation,
    inputs: list[torch.Tensor],
    layout: str,
    grads: list[torch.Tensor],
    grad_layout: str,
    loss: str,
) -> None:
    results: list[BackwardRun] = world.run(ranks.backward, impl, inputs, layout, grads, grad_layout, loss)
    for r, result in enumerate(results):
        assert result.input_intact, f"rank {r}: the caller's input was modified in place"
        assert result.grad_intact, f"rank {r}: the upstream gradient passed to out.backward(g) was modified in place"
        if result.out_grad is not None:
            assert_same(
                result.out_grad,
                grads[r],
                f"rank {r}: the gathered output's retained gradient (loss {loss!r}) after backward",
            )


#: What the in-place check's first, fixed example is, as its failure shows it.
FIXED_IN_PLACE_EXAMPLE = (
    "Fixed example (run first, whatever hypothesis draws): float32 inputs of shape (2, 3), each rank's "
    "upstream gradient contiguous and of positive integers differing between ranks, loss 'direct' "
    "(out.backward(g)): a backward that reduces or resets g in place changes it"
)


def _fixed_rank_example(size: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inputs and contiguous upstream gradients that any in-place reduction or reset of ``g`` would change.

    Every value is a positive integer (exact in float32), and rank r's
    gradient is ``r + 1`` times a pattern with no zero, so a sum over two or
    more ranks differs from every rank's own gradient.
    """
    inputs = [torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1 + 6 * r for r in range(size)]
    pattern = (torch.arange(size * 6, dtype=torch.float32) % 5 + 1).reshape(size * 2, 3)
    return inputs, [pattern * (r + 1) for r in range(size)]


@check("gather.inputs_and_grads_not_modified", tier="core", component="gather")
def inputs_and_grads_not_modified(world: WorldLike, impl: Implementation) -> None:
    """Forward and backward leave the caller's input, the upstream gradient and the output's retained grad intact.

    The first example is fixed (:data:`FIXED_IN_PLACE_EXAMPLE`), so a backward
    that reduces the caller's contiguous gradient in place is caught at every
    world size whatever hypothesis draws (its examples shrink toward zero
    gradients, which an in-place sum leaves unchanged); hypothesis's examples
    follow.
    """
    inputs, grads = _fixed_rank_example(world.size)
    try:
        _assert_not_modified(world, impl, inputs, "contiguous", grads, "contiguous", "direct")
    except AssertionError as exc:
        add_note(exc, FIXED_IN_PLACE_EXAMPLE)  # shown as the verdict's example, where hypothesis's goes
        raise

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        shape, dtype, layout, inputs = draw_laid_out_inputs(data, world, ds.float_dtypes())
        _, grads, grad_layout = draw_upstream_grads(data, world, shape, dtype)
        # Both losses give d loss / d out = g; "weighted" hands backward a fresh
        # tensor that is also what out.retain_grad() keeps.
        loss = data.draw(st.sampled_from(["direct", "weighted"]), label="loss")
        _assert_not_modified(world, impl, inputs, layout, grads, grad_layout, loss)

    prop()


def _check_nothing_to_gather(inputs: Sequence[torch.Tensor], result: Alone, where: str) -> None:
    x = inputs[0]
    assert result.is_x, f"{where}: all_gather_with_grad(x) did not return x itself"
    assert_same(result.no_grad_out, x, f"{where}: all_gather_no_grad(x)")


def _alone_inputs(data: st.DataObject) -> tuple[list[torch.Tensor], str]:
    shape, dtype = draw_shape_and_dtype(data, ds.all_dtypes())
    layout = data.draw(ds.layouts(shape), label="layout")
    return data.draw(ds.rank_tensors(1, shape, dtype), label="inputs"), layout


@check("gather.uninitialised_returns_input", tier="core", component="gather", needs_world=False)
def uninitialised_returns_input(world: None, impl: Implementation) -> None:
    """Without a process group, all_gather_with_grad returns x itself and all_gather_no_grad x's values."""
    target(impl).require_module("returning x when there is no process group")
    require_no_group()

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        inputs, layout = _alone_inputs(data)
        result = ranks.alone(impl, inputs, layout)  # here, in the parent: no process group
        _check_nothing_to_gather(inputs, result, "no process group")

    prop()


@check("gather.single_rank_returns_input", tier="core", component="gather", max_world=1)
def single_rank_returns_input(world: WorldLike, impl: Implementation) -> None:
    """In a world of one rank, all_gather_with_grad returns x itself and all_gather_no_grad x's values."""
    target(impl).require_module("returning x in a world of one")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        inputs, layout = _alone_inputs(data)
        (result,) = world.run(ranks.alone, impl, inputs, layout)
        _check_nothing_to_gather(inputs, result, "rank 0 of a world of 1")

    prop()


@check("gather.autograd_function_returns_rank_tuple", tier="core", component="gather")
def autograd_function_returns_rank_tuple(world: WorldLike, impl: Implementation) -> None:
    """_AllGatherWithGrad.apply(x) returns W tensors in rank order; backward follows the gradient rule."""
    target(impl).require_module("_AllGatherWithGrad")
    if not hasattr(impl.module("gather"), "_AllGatherWithGrad"):
        raise NotSupported(f"{impl.gather} has no _AllGatherWithGrad")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        shape, dtype = draw_shape_and_dtype(data, ds.float_dtypes())
        inputs = data.draw(ds.rank_tensors(world.size, shape, dtype), label="inputs")
        out_shape = (world.size * shape[0], *shape[1:])
        grads = data.draw(ds.upstream_grads(world.size, out_shape, dtype), label="upstream grads")
        results: list[AutogradParts] = world.run(ranks.autograd_function, impl, inputs, grads)
        expected = expected_grads(grads, [shape[0]] * world.size)
        for r, result in enumerate(results):
            parts = result.parts
            assert len(parts) == world.size, f"rank {r}: {len(parts)} tensors for {world.size} ranks"
            for i, part in enumerate(parts):
                assert_same(part, inputs[i], f"rank {r}: _AllGatherWithGrad part {i}")
            assert_same(result.grad, expected[r], f"rank {r}: _AllGatherWithGrad gradient of x")

    prop()
