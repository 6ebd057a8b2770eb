"""Layer 0 (no process group): the pp suite names a cause only where the numbers prove it.

What the checks do in worlds is proven by ``test_gallery_pp.py``; here only
the rules that turn what the ranks reported into a cause: every wrong tensor
exactly one factor (ratio within 1e-9, nothing left over), never a near miss,
never a factor of 1, and float32's looser rounding where the run declares it;
composed with data parallelism, a dp factor on exactly some whole FSDP2
units; and a stage placement exactly one style where the schedule runs the
other.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance.suites.pp.causes import cause_of, exact_factor
from nemo_dist.conformance.suites.pp.data_parallel_check import likely_cause
from nemo_dist.conformance.suites.pp.messages import DataParallelRun
from nemo_dist.conformance.suites.pp.placement import style_cause

SIZES = {"M": 4.0, "1/M": 0.25, "tokens": 48.0, "tokens/M": 12.0}


@pytest.mark.parametrize(("ratio", "name"), [(4.0, "M"), (0.25, "1/M"), (48.0, "tokens"), (12.0, "tokens/M")])
def test_every_tensor_exactly_one_factor_names_it(ratio: float, name: str) -> None:
    assert exact_factor([(ratio, 0.0), (ratio * (1 + 1e-12), 1e-13)], SIZES) == name


@pytest.mark.parametrize("pairs", [
    [(4.0, 0.0), (2.0, 0.0)],  # two tensors, two factors
    [(4.0 * (1 + 1e-6), 0.0)],  # a near miss
    [(4.0, 1e-3)],  # the right multiple on average, but not everywhere
    [(1.03, 0.0)],  # a real bug's few percent
    [],
])
def test_anything_short_of_an_exact_factor_names_none(pairs: list[tuple[float, float]]) -> None:
    assert exact_factor(pairs, SIZES) is None


def test_a_factor_of_one_proves_nothing() -> None:
    assert exact_factor([(1.0, 0.0)], {"M": 1.0, "1/M": 1.0}) is None


def test_a_lower_precision_run_allows_its_own_rounding() -> None:
    pairs = [(4.0 * (1 + 1e-7), 1e-7)]
    assert exact_factor(pairs, SIZES) is None
    assert exact_factor(pairs, SIZES, tolerance=1.9e-6) == "M"


def test_the_cause_says_the_factor_and_what_it_is() -> None:
    assert cause_of("1/M", "gradients", SIZES).startswith(
        "gradients 1/4 of one process's (one over the microbatch count): averaged over the microbatches twice")
    assert cause_of("tokens", "the loss is", SIZES).startswith("the loss is 48 times one process's (the batch's")


def _dp_run(grads: dict[str, tuple[float, float, float, float]], units: dict[str, str]) -> DataParallelRun:
    return DataParallelRun(pp=2, dp=2, dp_rank=0, stages=[0], tolerance=1e-12, units=units,
                           grads=dict(grads))


_RIGHT, _TWICE = (0.0, 1.0, 1.0, 0.0), (1.0, 1.0, 2.0, 0.0)
_UNITS = {"tok_embeddings.weight": "stage 0's root", "layers.0.w": "layers.0", "layers.0.b": "layers.0"}


def test_a_dp_factor_on_exactly_some_units_names_those_units() -> None:
    found = [_dp_run({"tok_embeddings.weight": _TWICE, "layers.0.w": _RIGHT, "layers.0.b": _RIGHT}, _UNITS)]
    wrong = {0: {"tok_embeddings.weight": _TWICE}}
    assert (likely_cause(found, wrong) or "").startswith("the parameters of the FSDP2 units stage 0's root "
                                                   "(tok_embeddings.weight) are 2 times")


@pytest.mark.parametrize("grads", [
    {"tok_embeddings.weight": _TWICE, "layers.0.w": _TWICE, "layers.0.b": _RIGHT},  # a unit half off
    {"tok_embeddings.weight": _TWICE, "layers.0.w": (1.0, 1.0, 1.5, 0.0), "layers.0.b": _RIGHT},  # two factors
])
def test_a_dp_factor_not_confined_to_whole_units_names_no_unit(
    grads: dict[str, tuple[float, float, float, float]],
) -> None:
    found = [_dp_run(grads, _UNITS)]
    wrong = {0: {label: pair for label, pair in grads.items() if pair != _RIGHT}}
    assert likely_cause(found, wrong) is None


def test_every_gradient_off_by_the_dp_size_names_the_factor_not_units() -> None:
    grads = {"tok_embeddings.weight": _TWICE, "layers.0.w": _TWICE, "layers.0.b": _TWICE}
    found = [_dp_run(grads, _UNITS)]
    cause = likely_cause(found, {0: dict(grads)}) or ""
    assert cause.startswith("every gradient is 2 times one process's (the dp size)"), cause


def _held(layout: dict[int, int]) -> dict[int, list[int]]:
    return {stage: [rank] for stage, rank in layout.items()}


def _mapped(layout: dict[int, int]) -> dict[int, set[int]]:
    return {stage: {rank} for stage, rank in layout.items()}


_LOOP = {0: 0, 1: 1, 2: 0, 3: 1}  # pp 2, two stages a rank, round robin
_V = {0: 0, 1: 1, 2: 1, 3: 0}  # pp 2, in a V


def test_stages_placed_round_robin_where_the_schedule_runs_a_v_name_that_cause() -> None:
    assert (style_cause(_held(_LOOP), _mapped(_V), 2) or "").startswith("the stages are placed round robin")


def test_stages_placed_in_a_v_where_the_schedule_runs_round_robin_name_that_cause() -> None:
    assert (style_cause(_held(_V), _mapped(_LOOP), 2) or "").startswith("the stages are placed in a V")


def test_a_placement_that_is_neither_style_names_no_cause() -> None:
    assert style_cause(_held({0: 0, 1: 0, 2: 1, 3: 1}), _mapped(_V), 2) is None
