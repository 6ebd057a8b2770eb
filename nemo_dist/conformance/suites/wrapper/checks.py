"""Behaviour checks of any data-parallel wrapper (``--ddp-fn``): what a correct one does, whatever its shape.

Each check wraps small float64 linear models on every rank through the
wrapper (:mod:`.ranks`), trains them through the declared step protocol and
asserts in the parent on what the ranks report: rank 0's weights on every
rank once wrapped, training equal to one process on the full batch under
the declared reduction (mean unless ``--ddp-reduction sum``), ranks
bit-identical, ``no_sync`` (or ``set_requires_gradient_sync(False)``)
accumulating like one big step where offered (and communicating nothing
meanwhile), gradients reduced in the declared dtype, a nested model of real
shape trained whole, buffers synced or local as declared, a world of one
that still trains, the model's dtype kept.

Comparisons are exact where the arithmetic is: on small-integer data the
exact training (:mod:`.exact`, in rationals) says when float64 computes every
value exactly in any order, and the parameters must then equal it bit for
bit; on normal draws (which expose a reduction in a lower precision) they
must agree within ``TOLERANCE_FLOAT64`` (1e-10 absolute and relative). A
wrapper computing below float64 (one that changed the model's dtype, or
one declared with ``--ddp-compute-dtype``) is compared within
``COMPUTE_ROUNDINGS`` roundings of that dtype's unit roundoff, of the
largest value compared (:func:`~nemo_dist.conformance.suites.ddp.expectations.rounding_tolerance`).
The dtype of every gradient reduction is read from the collectives
themselves and held to ``--ddp-reduce-dtype``, whatever the tolerance. A
failure carries the likely cause the ranks' reports name (:mod:`.diagnosis`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.engine.deadlines import StepAborted
from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check
from nemo_dist.conformance.suites.ddp.expectations import (
    COMPUTE_ROUNDINGS,
    TOLERANCE_FLOAT64,
    assert_close_lists,
    assert_close_rounded,
    computed_in,
)
from nemo_dist.conformance.suites.wrapper import diagnosis, nested, ranks, torch_faults
from nemo_dist.conformance.suites.wrapper.exact import exact_training
from nemo_dist.conformance.suites.wrapper.messages import (
    AccumulationReport,
    BufferViews,
    NestedReport,
    StartReport,
    Stepped,
    TrainReport,
)

__all__ = [
    "STEPS",
    "buffers_as_declared",
    "identical_start",
    "keeps_dtype",
    "no_sync_accumulates",
    "no_sync_skips_reduction",
    "ranks_stay_identical",
    "reduces_in_declared_dtype",
    "trains_a_nested_model",
    "trains_like_one_process",
    "world_of_one_trains",
]

#: SGD steps of the training checks.
STEPS = 3
#: (kind, seed, rows per rank) every training check runs first: exact integers, then normal draws.
FIXED_EXAMPLES: tuple[tuple[str, int, int], ...] = (("integers", 0, 2), ("normal", 1, 2))


def _wrapper(impl: Implementation) -> DDPWrapper:
    if impl.ddp_wrapper is None:
        raise NotApplicable("checks a --ddp-fn wrapper; none was named")
    return impl.ddp_wrapper


def _torch_fault(
    world: WorldLike, results: Sequence[Stepped], wrapper: DDPWrapper, observed: list[Any], expected: list[Any]
) -> str:
    """torch's own fault where torch alone, re-run, shows it (:mod:`.torch_faults`): the ranks' ``observed``
    gradients against their ``expected`` ones; "" where none is shown."""
    try:
        return torch_faults.double_divide(world.run, results, wrapper.mesh, observed, expected)
    except (Exception, StepAborted):  # a probe that breaks proves nothing: the wrapper's own diagnosis stands
        return ""


@contextmanager
def _explained(cause: Callable[[], str]) -> Iterator[None]:
    """Attach ``cause()`` as the likely cause of an assertion raised inside."""
    try:
        yield
    except AssertionError as exc:
        found = cause()
        if found:
            exc.likely_cause = found  # type: ignore[attr-defined]
        raise


def _assert_close(
    actual: list[Any], expected: list[Any], what: str, wrapper: DDPWrapper, dtype: str
) -> None:
    """``actual`` equals ``expected`` within float64's rounding, or the rounding of the dtype the rank computed in.

    Below float64 the tolerance is derived from that dtype
    (:func:`~nemo_dist.conformance.suites.ddp.expectations.rounding_tolerance`):
    :data:`COMPUTE_ROUNDINGS` roundings of the largest value compared.
    """
    computed = computed_in(dtype, wrapper.compute_dtype)
    if computed == torch.float64:
        assert_close_lists(actual, expected, what, TOLERANCE_FLOAT64)
    else:
        assert_close_rounded(actual, expected, what, computed, COMPUTE_ROUNDINGS, per_tensor=False)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _exact_params(
    impl: Implementation, kind: str, seed: int, global_batch: torch.Tensor, size: int, dtype: str
) -> list[torch.Tensor] | None:
    """The exact parameters after each step when float64 computes them exactly in any order, else None."""
    if kind != "integers" or computed_in(dtype, _wrapper(impl).compute_dtype) != torch.float64:
        return None
    weight, bias = ranks.initial_weights(seed, kind)
    run = exact_training(
        weight.tolist(), bias.tolist(), global_batch.tolist(), size, STEPS, ranks.LR, _wrapper(impl).reduction
    )
    if not run.exact:
        return None
    return [torch.tensor([float(v) for v in step], dtype=torch.float64) for step in run.params]


def _assert_trains(world: WorldLike, impl: Implementation, kind: str, seed: int, rows: int) -> list[TrainReport]:
    """Run :func:`.ranks.train`; assert every rank's parameters after each step equal one process on the full batch."""
    wrapper = _wrapper(impl)
    global_batch = ranks.batch(seed, kind, rows * world.size)
    results: list[TrainReport] = world.run(ranks.train, impl, seed, kind, global_batch, STEPS)
    exact = _exact_params(impl, kind, seed, global_batch, world.size, results[0].dtype)
    declared = f"under --ddp-reduction {wrapper.reduction}, {kind} data, {rows} row(s) per rank"
    observed = [r.grads[0] if r.grads else None for r in results]
    expected = [r.expected[0] if r.expected else None for r in results]
    with _explained(lambda: _torch_fault(world, results, wrapper, observed, expected)
                    or diagnosis.training_cause(results, wrapper)):
        for rank, got in enumerate(results):
            for step, params in enumerate(got.params, start=1):
                what = f"rank {rank}, parameters after step {step} vs one process on the full batch ({declared})"
                if exact is not None:
                    assert torch.equal(params, exact[step - 1]), (
                        f"{what}, exact (float64 computes this example exactly in any order): "
                        f"max |diff| {(params - exact[step - 1]).abs().max().item():.3g}\n"
                        f"got      {params.tolist()}\nexpected {exact[step - 1].tolist()}"
                    )
                else:
                    _assert_close([params], [got.reference[step - 1]], what, wrapper, got.dtype)
    return results


def _examples() -> int:
    return max(1, settings().max_examples // 5)


@check("wrapper.identical_start", tier="core", component="wrapper", min_world=2)
def identical_start(world: WorldLike, impl: Implementation) -> None:
    """Ranks built with different initial weights all hold rank 0's once wrapped (by their first forward's end)."""
    if _wrapper(impl).identical_start:
        raise NotApplicable(
            "--ddp-start identical declares that the wrapper expects identical weights on every rank (same seed "
            "or a checkpoint load): every rank's model is built from one seed, and nothing is left to synchronise"
        )
    results: list[StartReport] = world.run(ranks.start, impl, 7)
    with _explained(lambda: diagnosis.start_cause([r.own for r in results], [r.after for r in results])):
        for rank, got in enumerate(results[1:], start=1):
            diff = (got.after - results[0].own).abs().max().item()
            assert torch.equal(got.after, results[0].own), (
                f"rank {rank} holds other weights than rank 0's initial ones after wrapping and one forward "
                f"(max |diff| {diff:.3g}); a data-parallel wrapper starts every rank from the same weights"
            )


@check("wrapper.trains_like_one_process", tier="core", component="wrapper", min_world=2)
def trains_like_one_process(world: WorldLike, impl: Implementation) -> None:
    """From per-rank initial weights, 3 SGD steps equal one process on the full batch under the declared reduction."""

    @settings(max_examples=_examples())
    @given(kind=st.sampled_from(["integers", "normal"]), seed=st.integers(0, 2**16), rows=st.integers(1, 4))
    @example(kind=FIXED_EXAMPLES[0][0], seed=FIXED_EXAMPLES[0][1], rows=FIXED_EXAMPLES[0][2])
    @example(kind=FIXED_EXAMPLES[1][0], seed=FIXED_EXAMPLES[1][1], rows=FIXED_EXAMPLES[1][2])
    def prop(kind: str, seed: int, rows: int) -> None:
        _assert_trains(world, impl, kind, seed, rows)

    prop()


@check("wrapper.world_of_one_trains", tier="core", component="wrapper", max_world=1)
def world_of_one_trains(world: WorldLike, impl: Implementation) -> None:
    """In a world of one rank the wrapper (or the model it returns) trains exactly as one process."""
    for kind, seed, rows in FIXED_EXAMPLES:
        _assert_trains(world, impl, kind, seed, rows)


@check("wrapper.ranks_stay_identical", tier="core", component="wrapper", min_world=2)
def ranks_stay_identical(world: WorldLike, impl: Implementation) -> None:
    """After every step of training on normal draws, every rank's parameters equal rank 0's bit for bit."""
    wrapper = _wrapper(impl)
    seed, rows = 3, 2
    results: list[TrainReport] = world.run(
        ranks.train, impl, seed, "normal", ranks.batch(seed, "normal", rows * world.size), STEPS
    )
    with _explained(lambda: diagnosis.training_cause(results, wrapper)):
        for rank, got in enumerate(results[1:], start=1):
            for step, (params, first) in enumerate(zip(got.params, results[0].params, strict=True), start=1):
                assert torch.equal(params, first), (
                    f"rank {rank}'s parameters after step {step} differ from rank 0's (max |diff| "
                    f"{(params - first).abs().max().item():.3g}); data-parallel replicas must stay bit-identical"
                )


def _micro_batches(seed: int, kind: str, rows: int, size: int, count: int) -> torch.Tensor:
    return torch.stack([ranks.batch(seed + m, kind, rows * size) for m in range(count)])


def _assert_accumulates(world: WorldLike, impl: Implementation, kind: str, seed: int, rows: int) -> None:
    """Run :func:`.ranks.accumulation` on 3 micro-batches; assert the gradient is one big step's on all of them."""
    wrapper = _wrapper(impl)
    micro = _micro_batches(seed, kind, rows, world.size, 3)
    results: list[AccumulationReport] = world.run(ranks.accumulation, impl, seed, kind, micro)
    if results[0].offered is None:
        raise NotApplicable(f"{wrapper.label} offers neither no_sync() nor set_requires_gradient_sync()")
    exact = kind == "integers" and _power_of_two(world.size) and _power_of_two(rows)
    with _explained(lambda: _torch_fault(world, results, wrapper, [r.grad for r in results],
                                         [r.expected for r in results])
                    or diagnosis.no_sync_cause(results, wrapper)):
        for rank, got in enumerate(results):
            what = (
                f"rank {rank}: gradient after 2 micro-batches under {got.offered} and 1 synced vs one big "
                f"step on all of them (under --ddp-reduction {wrapper.reduction}, {kind} data)"
            )
            assert got.grad is not None, f"{what}: the wrapper left no gradient"
            want = got.expected
            assert want is not None  # computed in this process whenever the wrapper offers a way to skip the sync
            if exact:
                assert torch.equal(got.grad, want), (
                    f"{what}, exact:\ngot      {got.grad.tolist()}\nexpected {want.tolist()}"
                )
            else:
                _assert_close([got.grad], [want], what, wrapper, got.dtype)


@check("wrapper.no_sync_accumulates", tier="core", component="wrapper", min_world=2)
def no_sync_accumulates(world: WorldLike, impl: Implementation) -> None:
    """Micro-batches under no_sync() (or set_requires_gradient_sync(False)) then one synced give one big step's grad."""
    for kind, seed, rows in FIXED_EXAMPLES:
        _assert_accumulates(world, impl, kind, seed, rows)


@check("wrapper.no_sync_skips_reduction", tier="core", component="wrapper", min_world=2)
def no_sync_skips_reduction(world: WorldLike, impl: Implementation) -> None:
    """Under no_sync() (or set_requires_gradient_sync(False)) a backward runs no gradient reduction on any rank."""
    wrapper = _wrapper(impl)
    kind, seed, rows = FIXED_EXAMPLES[0]
    results: list[AccumulationReport] = world.run(
        ranks.accumulation, impl, seed, kind, _micro_batches(seed, kind, rows, world.size, 3)
    )
    if results[0].offered is None:
        raise NotApplicable(f"{wrapper.label} offers neither no_sync() nor set_requires_gradient_sync()")
    if not any(got.unsynced_reductions or got.reduced for got in results):
        raise NotApplicable(
            f"the profiler recorded no gradient reduction in the synced backward either (a world of {world.size}), "
            "so that none ran under the context proves nothing"
        )
    for rank, got in enumerate(results):
        ran = got.unsynced_reductions
        names = ", ".join(sorted({name for name, _ in ran}))
        assert not ran, (
            f"rank {rank}: 2 backward passes under {got.offered} ran {len(ran)} gradient reduction(s) "
            f"({names}); skipping them is what {got.offered} is for (the gradient may "
            "still come out right: reducing each micro-batch and summing equals reducing the sum)"
        )


@check("wrapper.reduces_in_declared_dtype", tier="core", component="wrapper")
def reduces_in_declared_dtype(world: WorldLike, impl: Implementation) -> None:
    """Every gradient reduction a training step runs reduces tensors at least as precise as --ddp-reduce-dtype
    (float32 unless declared), read from the backend's collectives themselves, whatever the result's tolerance."""
    wrapper = _wrapper(impl)
    kind, seed, rows = FIXED_EXAMPLES[1]
    results: list[TrainReport] = world.run(ranks.train, impl, seed, kind, ranks.batch(seed, kind, rows * world.size), 1)
    typed = [(event, dtype) for got in results for event, dtype in got.reduced if dtype]
    if not typed:
        ran = "no gradient reduction ran" if not any(got.reduced for got in results) else (
            "the profiler recorded no dtype of the reductions that ran"
        )
        raise NotApplicable(f"{ran} in a training step in a world of {world.size}")
    with _explained(lambda: diagnosis.precision_cause(results, wrapper)):
        for rank, got in enumerate(results):
            low = diagnosis.reductions_below(got.reduced, wrapper.reduce_dtype)
            assert not low, (
                f"rank {rank}: a training step's backward reduced gradients in {low[0][1]} "
                f"({', '.join(f'{event} on {dtype}' for event, dtype in low)}), below --ddp-reduce-dtype "
                f"{wrapper.reduce_dtype}; the model's parameters are {got.dtype}"
            )


@check("wrapper.trains_a_nested_model", tier="core", component="wrapper")
def trains_a_nested_model(world: WorldLike, impl: Implementation) -> None:
    """A model shaped like real ones (root parameter, embedding, norm, buffer, dropout, keyword argument) trains in
    train mode as one process does on the full batch, every parameter of it, on every rank."""
    wrapper = _wrapper(impl)
    results: list[NestedReport] = world.run(nested.nested_training, impl)
    with _explained(lambda: diagnosis.nested_cause(results, wrapper)):
        _assert_nested(results, wrapper)


def _assert_nested(results: Sequence[NestedReport], wrapper: DDPWrapper) -> None:
    for rank, got in enumerate(results):
        evaluated = [i for i, (model, dropout) in enumerate(got.modes) if not (model and dropout)]
        assert not evaluated, (
            f"rank {rank}: forward {evaluated[0] + 1} ran in eval mode (model.training, dropout.training = "
            f"{got.modes[evaluated[0]]}); a wrapper must leave the model in the train mode it was given"
        )
        for step, (params, reference) in enumerate(zip(got.params, got.reference, strict=True), start=1):
            _assert_close(
                params, reference,
                f"rank {rank}, after step {step} of {nested.NESTED_STEPS}: parameters ({', '.join(got.names)}) vs "
                "one process trained on the full batch (a wrapper syncing only some parameters, only nn.Linear "
                "layers or only the root module's own, leaves the others to drift)",
                wrapper, got.dtype,
            )


def _buffer_finding(seen: Sequence[Sequence[float]]) -> str:
    """What the buffers each rank's forwards saw say: synced, local, synced at construction only, or other.

    Every rank is judged, rank 0 included: buffers synced from another rank
    than 0 are "other" (rank 0 then sees that rank's values, not its own).
    """
    ranks_seen = list(enumerate(seen))
    if all(s == [0.0, 10.0] for _, s in ranks_seen):
        return "synced"
    if all(s == [float(r), float(r + 10)] for r, s in ranks_seen):
        return "local"
    if all(s == [0.0, float(r + 10)] for r, s in ranks_seen):
        return "synced at construction only"
    return "other"


_FINDINGS = {
    "synced": "synced: every forward saw rank 0's buffers",
    "local": "local: every rank's forwards saw its own buffers",
    "synced at construction only": "synced at construction only: the first forward saw rank 0's buffers, "
    "the second each rank's own (changed in between)",
    "other": "neither synced from rank 0 nor local",
}


@check("wrapper.buffers_as_declared", tier="core", component="wrapper", min_world=2)
def buffers_as_declared(world: WorldLike, impl: Implementation) -> None:
    """Module buffers are synced from rank 0 or left local, as --ddp-buffers declares (reported when undeclared)."""
    wrapper = _wrapper(impl)
    views: list[BufferViews] = world.run(ranks.buffer_views, impl)
    seen = [got.seen for got in views]
    finding = _buffer_finding(seen)
    shown = "; ".join(f"rank {r}: {s}" for r, s in enumerate(seen))
    if wrapper.buffers is None:
        raise NotApplicable(
            f"buffers {_FINDINGS[finding]} (declare --ddp-buffers synced or local, under pytest "
            "--conformance-ddp-buffers, to hold the wrapper to it; "
            f"buffer values seen by each forward, set to the rank then to rank + 10: {shown})"
        )
    assert finding == wrapper.buffers, (
        f"--ddp-buffers {wrapper.buffers} was declared, but buffers were {_FINDINGS[finding]} (buffer values "
        f"seen by each forward, set to the rank before wrapping and to rank + 10 before the second: {shown})"
    )


@check("wrapper.keeps_dtype", tier="extended", component="wrapper")
def keeps_dtype(world: WorldLike, impl: Implementation) -> None:
    """The wrapper leaves the model's parameter dtype as it is (a float64 model stays float64)."""
    starts: list[StartReport] = world.run(ranks.start, impl, 5)
    for rank, got in enumerate(starts):
        assert got.dtype == "torch.float64", (
            f"rank {rank}: {_wrapper(impl).label} changed the model's parameters from torch.float64 to "
            f"{got.dtype} (the training checks compare in that dtype's tolerance)"
        )
