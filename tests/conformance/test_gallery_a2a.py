"""Layer 2: gloo worlds of 2 ranks. The gallery of autograd all-to-alls (``tests/forks/gallery_a2a_*``) and torch's.

Each row re-expresses one public pattern (its docstring names it;
``docs/a2a.md`` has the table), correct or broken, and runs as
``nemo-dist-conformance --a2a-fn ...`` runs it, every a2a check, in a world
of 2. A correct row conforms (its core checks pass); a broken one fails
exactly the checks it lists, its guards naming its cause. Every row but the
guards' runs is ``thorough``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.a2a.causes import (
    DETACHED,
    IN_PLACE,
    LOWER_DTYPE,
    MULTIPLIED,
    NOT_SWAPPED,
    PERMUTED,
    REDUCED,
)
from nemo_dist.conformance.suites.a2a.causes import (
    GROUP as GROUP_CAUSE,
)
from nemo_dist.testing.plugin import WorldFactory

G = "tests.forks.gallery_a2a_"
FORWARD, BACKWARD = "a2a.forward_routes_rows_in_rank_order", "a2a.backward_returns_each_row_its_gradient"
INTACT, GROUP = "a2a.inputs_and_grads_not_modified", "a2a.group_is_honoured"
MISMATCHED = "a2a.mismatched_sizes_refused_on_every_rank"
#: What torch's own all-to-alls fail: splits that disagree go to the backend unchecked (extended tier).
UNCHECKED = frozenset({MISMATCHED})


@dataclass(frozen=True)
class Row:
    """A callable (``MODULE:NAME``), its ``--a2a-kwarg`` values, the a2a checks it fails in a world of 2, the
    ones the gate runs for it (``guards``; none: every check) and what their failures must name."""

    fn: str
    kwargs: tuple[str, ...] = ()
    failing: frozenset[str] = frozenset()
    guards: frozenset[str] = frozenset()
    cause: str | None = None


def _cause(text: str) -> str:
    return text.split(":")[0]


GALLERY: dict[str, Row] = {
    "torch_nn_functional": Row("torch.distributed.nn.functional:all_to_all_single", failing=UNCHECKED),
    "torch_functional_collectives": Row(
        "torch.distributed._functional_collectives:all_to_all_single_autograd", failing=UNCHECKED
    ),
    "megatron": Row(
        G + "megatron:all_to_all", ("input_=@input", "output_split_sizes_=@output_split_sizes"), failing=UNCHECKED
    ),
    "deepspeed": Row(G + "deepspeed:_AllToAll"),
    "torchtitan": Row(G + "torchtitan:dispatch"),
    "splits_not_swapped": Row(
        G + "splits_not_swapped:all_to_all", failing=UNCHECKED | {BACKWARD}, guards=frozenset({BACKWARD}),
        cause=_cause(NOT_SWAPPED),
    ),
    "scaled": Row(
        G + "scaled:all_to_all", failing=UNCHECKED | {BACKWARD}, guards=frozenset({BACKWARD}),
        cause=MULTIPLIED.format(factor=2, divisor=" (W = 2)").split(":")[0],
    ),
    "detached": Row(
        G + "detached:all_to_all", failing=UNCHECKED | {FORWARD, BACKWARD, GROUP},
        guards=frozenset({FORWARD, BACKWARD}), cause=_cause(DETACHED),
    ),
    "blocks_reversed": Row(
        G + "blocks_reversed:all_to_all", failing=UNCHECKED | {BACKWARD}, guards=frozenset({BACKWARD}),
        cause=_cause(PERMUTED),
    ),
    "group_ignored": Row(
        G + "group_ignored:all_to_all", failing=UNCHECKED | {GROUP}, guards=frozenset({GROUP}),
        cause=_cause(GROUP_CAUSE),
    ),
    "backward_bfloat16": Row(
        G + "backward_bfloat16:all_to_all", failing=UNCHECKED | {BACKWARD, GROUP}, guards=frozenset({BACKWARD, GROUP}),
        cause=LOWER_DTYPE.format(dtype="bfloat16").split(":")[0],
    ),
    "backward_all_reduced": Row(
        G + "backward_all_reduced:_AllToAll", failing=frozenset({BACKWARD}), guards=frozenset({BACKWARD}),
        cause=_cause(REDUCED),
    ),
    "grad_written_in_place": Row(
        G + "grad_written_in_place:all_to_all", failing=UNCHECKED | {BACKWARD, INTACT},
        guards=frozenset({BACKWARD, INTACT}), cause=_cause(IN_PLACE),
    ),
}

_REPORTS: dict[tuple[str, bool], tuple[Report, str]] = {}


def _report(name: str, whole: bool, world_factory: WorldFactory) -> tuple[Report, str]:
    """Row ``name``'s one report: every a2a check (``whole``) or its guards alone, in a world of 2."""
    key = (name, whole)
    if key not in _REPORTS:
        row = GALLERY[name]
        impl, components = resolve_implementation(suite_options={"a2a_fn": row.fn, "a2a_kwarg": list(row.kwargs)})
        validate_implementation(impl, components)
        checks = select_checks(load_checks().values(), impl, "all", None, components)
        if not whole:
            checks = [c for c in checks if c.name in row.guards]
        report = run_checks(checks, impl, (2,), worlds=world_factory, components=components)
        _REPORTS[key] = (report, format_report(report))
    return _REPORTS[key]


def _params(names: list[str], *, thorough: bool) -> list[object]:
    return [
        pytest.param(
            n, id=n,
            marks=[pytest.mark.xdist_group(name="a2a_gallery"), *([pytest.mark.thorough] if thorough else [])],
        )
        for n in names
    ]


_BROKEN = [n for n, row in GALLERY.items() if row.guards]
_CORRECT = [n for n, row in GALLERY.items() if not row.guards]


@pytest.mark.parametrize("name", _params(_CORRECT, thorough=False))
def test_correct_all_to_all_passes_every_core_check(name: str, world_factory: WorldFactory) -> None:
    """A correct all-to-all passes routing, gradient, intactness and group checks; it fails only what it states."""
    report, table = _report(name, True, world_factory)
    assert report.exit_code() == 0, table
    assert {v.check for v in report.verdicts if v.failed} == GALLERY[name].failing, table
    assert {v.check for v in report.verdicts if v.outcome == "pass"} >= {FORWARD, BACKWARD, INTACT, GROUP}, table


@pytest.mark.parametrize("name", _params(_BROKEN, thorough=False))
def test_broken_all_to_all_fails_its_guards_naming_the_cause(name: str, world_factory: WorldFactory) -> None:
    """The checks guarding a row's bug fail, each naming the row's likely cause, none hanging."""
    row = GALLERY[name]
    report, table = _report(name, False, world_factory)
    assert {v.check for v in report.verdicts if v.failed} == row.guards, table
    if row.cause is not None:
        assert all(row.cause in (v.cause or "") for v in report.verdicts if v.failed), table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.parametrize("name", _params(_BROKEN, thorough=True))
def test_broken_all_to_all_fails_exactly_its_stated_checks(name: str, world_factory: WorldFactory) -> None:
    """Every a2a check run, a broken row fails exactly the checks it states, none hanging."""
    row = GALLERY[name]
    report, table = _report(name, True, world_factory)
    assert {v.check for v in report.verdicts if v.failed} == row.failing, table
    assert not [v for v in report.verdicts if v.outcome == "hang"], table


@pytest.mark.xdist_group(name="a2a_gallery_4")
def test_a_target_wrong_over_the_whole_world_is_not_blamed_on_its_groups(world_factory: WorldFactory) -> None:
    """In a world of 4 (groups of 2) the backward scaled by the group size fails the group check too, and its cause
    there is the exact factor, never the group: the cause is proven by the gradients, not by the check's name."""
    row = GALLERY["scaled"]
    impl, components = resolve_implementation(suite_options={"a2a_fn": row.fn})
    checks = [c for c in select_checks(load_checks().values(), impl, "all", None, components) if c.name == GROUP]
    report = run_checks(checks, impl, (4,), worlds=world_factory, components=components)
    table = format_report(report)
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail", table
    assert MULTIPLIED.format(factor=2, divisor=" (W = 2)").split(":")[0] in verdict.cause, table
    assert _cause(GROUP_CAUSE) not in verdict.cause, table
