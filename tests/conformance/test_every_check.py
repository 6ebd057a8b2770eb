"""Layer 2: gloo worlds of the ``--dist-world-sizes``. Every registered check holds for the bundled reference.

Parametrized over the registry (:func:`nemo_dist.conformance.cases`, as the
command and ``pytest conformance/`` expand it): a check added to the registry
runs here with nothing else to write. Each case runs through the runner, so
the verdict is the command's; the reference must PASS every case that applies
to its world size, and what the checks record as warnings is raised again
here, under the suite's warnings-as-errors (``filterwarnings``). A check that cannot run here (the real-model
checks without transformers) is skipped with its reason.
"""

from __future__ import annotations

import builtins
import warnings

import pytest

from nemo_dist.conformance import REFERENCE, Case, cases, format_report, load_checks, run_case
from nemo_dist.conformance.verdicts import Report
from nemo_dist.testing.plugin import WorldFactory, selected_world_sizes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per registry case of the reference that applies to a selected world size."""
    if "case" not in metafunc.fixturenames:
        return
    params = []
    for case in cases(load_checks().values(), REFERENCE, selected_world_sizes(metafunc.config)):
        if not case.applies:
            continue
        marks = [pytest.mark.xdist_group(name=f"nemo_dist_gloo_w{case.world_size}")] if case.world_size else []
        params.append(pytest.param(case, id=f"{case.name}-w{case.world_size or '-'}", marks=marks))
    metafunc.parametrize("case", params)


def test_reference_passes_the_registered_check(case: Case, world_factory: WorldFactory) -> None:
    """The bundled reference gets PASS, warning nothing unfiltered, on this check in a world of this size (or none)."""
    world = world_factory(case.world_size) if case.world_size else None
    verdict = run_case(case, world)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.message)
    table = format_report(Report((verdict,), REFERENCE, "gloo"))
    assert verdict.outcome == "pass", table
    for text in verdict.warnings:  # re-raised here, so the suite's filterwarnings judge them
        category, _, message = text.partition(": ")
        found = getattr(builtins, category, Warning)
        warnings.warn(message, found if isinstance(found, type) and issubclass(found, Warning) else Warning, 1)
