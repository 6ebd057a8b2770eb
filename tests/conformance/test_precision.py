"""Layers 0 and 2: the precision contract of the gather.

Layer 0 (no process): the bound of :func:`~nemo_dist.conformance.suites.gather.
precision.reduction_bound` holds for every correct way of summing W gradients
in their own dtype (each summation order, a tree, a wider accumulator, a mean
rescaled), bfloat16 and float16 included, and is exceeded by a reduction in a
lower precision of float64 or float32 gradients. Layer 2 (gloo worlds of 2):
``gather.float_grads_within_tolerance`` fails gathers that reduce (or gather)
in a lower precision and names the precision as the likely cause; a gather
that sums in a wider dtype conforms.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dist.conformance import Implementation, format_report, load_checks, run_checks
from nemo_dist.conformance.engine.verdicts import Verdict
from nemo_dist.conformance.suites.gather.precision import exact_grads, lower_precisions, reduction_bound
from nemo_dist.testing import strategies as ds
from nemo_dist.testing.plugin import WorldFactory

CHECK = "gather.float_grads_within_tolerance"
_WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def _sequential(terms: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    total = terms[0].to(dtype)
    for term in terms[1:]:
        total = total + term.to(dtype)  # rounds to dtype at every step
    return total


def _tree(terms: list[torch.Tensor]) -> torch.Tensor:
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def _correct_sums(grads: list[torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every way a correct reduction may sum ``grads`` in ``dtype``: orders, tree, wider accumulator, mean * W."""
    world = len(grads)
    orders = list(itertools.permutations(range(world))) if world <= 4 else [tuple(range(world))]
    if world > 4:
        orders += [tuple(reversed(range(world))), (*range(1, world), 0)]
    sums = {f"order {order}": _sequential([grads[i] for i in order], dtype) for order in orders}
    sums["tree"] = _tree(list(grads))
    wide = _WIDER.get(dtype, torch.float64)
    sums[f"in {wide}, rounded once"] = _sequential(list(grads), wide).to(dtype)
    sums["mean times W"] = (_sequential(list(grads), dtype) / world) * world
    return sums


@settings(max_examples=300)
@given(data=st.data())
def test_correct_reductions_in_the_gradients_dtype_stay_within_the_bound(data: st.DataObject) -> None:
    """W * eps * sum|g| (+ subnormal term) bounds every correct summation in the dtype, bfloat16 and float16 too."""
    world = data.draw(st.integers(1, 8), label="W")
    shape = data.draw(ds.shapes(min_rows=1), label="shape")
    dtype = data.draw(ds.float_dtypes(), label="dtype")
    scale = data.draw(st.sampled_from([1.0, 2.0**-20, 2.0**10]), label="scale")
    grads = [g * scale for g in data.draw(ds.upstream_grads(world, shape, dtype, values="random"), label="grads")]
    (exact,) = exact_grads(grads, [shape[0]])
    (bound,) = reduction_bound(grads, [shape[0]], dtype)
    for how, total in _correct_sums(grads, dtype).items():
        assert total.dtype == dtype
        error = (total.double() - exact).abs()
        assert bool((error <= bound).all()), f"{how} in {dtype}: error {error} over bound {bound}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_reductions_in_a_lower_precision_exceed_the_bound(dtype: torch.dtype) -> None:
    """Reducing float64 or float32 random gradients in any lower precision exceeds the bound (seeds 0..99, W 2..8)."""
    for seed in range(100):
        world = 2 + seed % 7
        generator = torch.Generator().manual_seed(seed)
        grads = [torch.randn((2, 3), generator=generator, dtype=torch.float64).to(dtype) for _ in range(world)]
        (exact,) = exact_grads(grads, [2])
        (bound,) = reduction_bound(grads, [2], dtype)
        for via in lower_precisions(dtype):
            lossy = _sequential(grads, via).to(dtype)
            assert bool(((lossy.double() - exact).abs() > bound).any()), f"seed {seed}: {dtype} in {via} passed"


def test_exact_grads_is_the_correctly_rounded_sum() -> None:
    """The reference sums exactly (fsum), where a float64 sum loses the small term: 1 + 2**-60 - 1 is 2**-60."""
    grads = [torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0**-60], dtype=torch.float64),
             torch.tensor([-1.0], dtype=torch.float64)]
    (exact,) = exact_grads(grads, [1])
    assert exact.item() == 2.0**-60
    assert sum(g.item() for g in grads) == 0.0  # what a float64 reference would say
    assert math.fsum(g.item() for g in grads) == exact.item()


def test_lower_precisions_are_ordered_by_mantissa_bits() -> None:
    """float64 -> float32, float16, bfloat16; float32 -> float16, bfloat16; bfloat16 has none."""
    assert lower_precisions(torch.float64) == (torch.float32, torch.float16, torch.bfloat16)
    assert lower_precisions(torch.float32) == (torch.float16, torch.bfloat16)
    assert lower_precisions(torch.float16) == (torch.bfloat16,)
    assert lower_precisions(torch.bfloat16) == ()


def _run(
    name: str, world_factory: WorldFactory, sizes: tuple[int, ...], max_examples: int
) -> tuple[list[Verdict], str]:
    """The precision check alone on the ``_precision_gathers`` callable ``name``: verdicts and table."""
    impl = Implementation(gather=None, gather_fn=f"tests.conformance._precision_gathers:{name}")
    checks = [c for c in load_checks().values() if c.name == CHECK]
    report = run_checks(
        checks, impl, sizes, max_examples=max_examples, worlds=world_factory, components=("gather",)
    )
    return list(report.verdicts), format_report(report)


_LOSSY = [
    ("FLOAT64_IN_FLOAT32", "reduced in float32: gradients match a float32 reduction of float64 values (error "),
    ("FLOAT64_IN_BFLOAT16", "reduced in bfloat16: gradients match a bfloat16 reduction of float64 values"),
    ("FLOAT32_IN_FLOAT16", "reduced in float16: gradients match a float16 reduction of float32 values"),
    ("FLOAT32_IN_BFLOAT16", "reduced in bfloat16: gradients match a bfloat16 reduction of float32 values"),
    ("FORWARD_FLOAT64_VIA_FLOAT32", "gathered in float32: the output is the float64 inputs rounded to float32"),
]


@pytest.mark.parametrize(("name", "cause"), _LOSSY, ids=[name.lower() for name, _ in _LOSSY])
def test_a_gather_losing_precision_fails_naming_the_precision(
    name: str, cause: str, world_factory: WorldFactory
) -> None:
    """Reducing (or gathering) in a lower precision FAILs the core precision check; the cause names the precision."""
    verdicts, table = _run(name, world_factory, (2,), 5)
    (verdict,) = verdicts
    assert verdict.outcome == "fail", table
    assert verdict.tier == "core", table
    assert verdict.cause.startswith(cause), table


def test_a_gather_summing_in_a_wider_dtype_conforms(world_factory: WorldFactory) -> None:
    """bfloat16 and float16 summed in float32, float32 in float64, then rounded once: PASS in worlds of 2 and 3."""
    verdicts, table = _run("WIDER", world_factory, (2, 3), 10)
    assert [v.outcome for v in verdicts] == ["pass", "pass"], table
