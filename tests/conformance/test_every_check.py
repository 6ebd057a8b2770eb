"""Layer 2: gloo worlds of the ``--dist-world-sizes``. Every registered check holds for the bundled reference.

Parametrized over the registry (:func:`nemo_dist.conformance.cases`, as the
command and ``pytest conformance/`` expand it): a check added to the registry
runs here with nothing else to write. Each case runs through the runner, so
the verdict is the command's; the reference must PASS every case that applies
to its world size, and what the checks record as warnings is raised again
here, under the suite's warnings-as-errors (``filterwarnings``).

The gate runs every check at least once, and the exhaustive matrix only
where it proves something (the rest is marked ``thorough``, run with
``--thorough``):

- the ddp checks through ``parallelize_ddp``; through ``DDPManager`` only the
  checks of what the manager adds (its constructor's error and attributes,
  what ``parallelize`` returns and where it places the model), since the
  bundled ``DDPManager.parallelize`` is one call of ``parallelize_ddp``
  (forks, whose two entry points may differ, run both: ``test_forks.py``);
- the checks marked ``once`` in one world, as the command runs them: the
  smallest selected one they fit;
- the ``sampled`` checks (the checkpointing checks, hand-made and
  real-transformers models) in one world too, the smallest selected one with
  two ranks or more, where they check every scope and mode: what they count
  happens inside each rank. The command runs them in every world.

The behaviour checks of a ``--ddp-fn`` wrapper (component ``wrapper``) have
nothing to check in modules: their reference is torch's own
``DistributedDataParallel`` named as a wrapper (:data:`REFERENCE_WRAPPER`,
declared to sync buffers, as it does by default), run through the same cases.

The real-model checks need transformers: without it they skip, or fail
under ``--require-targets``.
"""

from __future__ import annotations

import builtins
import warnings

import pytest

from nemo_dist.conformance import REFERENCE, Case, Implementation, cases, format_report, load_checks, run_case
from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.engine.verdicts import Report
from nemo_dist.testing.plugin import WorldFactory, selected_world_sizes
from tests import targets

#: The entry point every ddp check of the reference runs through in the gate.
GATE_API = "parallelize_ddp"
#: The checks of what DDPManager adds over parallelize_ddp, run through it in the gate too.
MANAGER_CHECKS = frozenset(
    {
        "ddp.requires_process_group",
        "ddp.manager_attributes",
        "ddp.parallelize_wraps_and_places",
        "ddp.world_of_one_wrapped_in_ddp",
    }
)
#: torch's DistributedDataParallel as a --ddp-fn wrapper: the reference of the wrapper checks.
REFERENCE_WRAPPER = Implementation(
    ddp=None, ddp_wrapper=DDPWrapper("torch.nn.parallel:DistributedDataParallel", buffers="synced")
)
#: The checks that build real transformers models on every rank.
REAL_MODEL_CHECKS = frozenset({"ddp.checkpointing_real_models", "ddp.checkpointing_real_models_beyond_upstream"})


def in_gate(case: Case, sizes: tuple[int, ...]) -> bool:
    """Whether the gate runs this case of the reference (the others are marked thorough).

    ``sizes`` are the selected world sizes. A ``sampled`` check (the
    checkpointing checks, the tp checks) runs in the smallest of them it fits with two ranks or more,
    where it is thorough (the smallest selected one if none has); a ``once``
    check has a case that applies in one selected world only. So each check
    runs at least once whatever is selected.
    """
    api = case.name.partition("[")[2].rstrip("]")
    if api and api != GATE_API and case.check.name not in MANAGER_CHECKS:
        return False
    if case.check.sampled:
        fits = [s for s in sizes if case.check.applies_to(s)]
        return case.world_size == min((s for s in fits if s >= 2), default=min(fits, default=0))
    return True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per registry case of the reference that applies to a selected world size."""
    if "case" not in metafunc.fixturenames:
        return
    params = []
    sizes = selected_world_sizes(metafunc.config)
    checks = load_checks().values()
    wrapper_checks = [c for c in checks if c.component == "wrapper"]
    for case in [*cases(checks, REFERENCE, sizes), *cases(wrapper_checks, REFERENCE_WRAPPER, sizes)]:
        if not case.applies:
            continue
        marks = [pytest.mark.xdist_group(name=f"nemo_dist_gloo_w{case.world_size}")] if case.world_size else []
        if not in_gate(case, sizes):
            marks.append(pytest.mark.thorough)
        params.append(pytest.param(case, id=f"{case.name}-w{case.world_size or '-'}", marks=marks))
    metafunc.parametrize("case", params)


def test_reference_passes_the_registered_check(case: Case, world_factory: WorldFactory) -> None:
    """The bundled reference gets PASS, warning nothing unfiltered, on this check in a world of this size (or none)."""
    if case.check.name in REAL_MODEL_CHECKS:
        targets.import_target("transformers")
    world = world_factory(case.world_size) if case.world_size else None
    verdict = run_case(case, world)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.message)
    table = format_report(Report((verdict,), case.impl or REFERENCE, "gloo"))
    assert verdict.outcome == "pass", table
    for text in verdict.warnings:  # re-raised here, so the suite's filterwarnings judge them
        category, _, message = text.partition(": ")
        found = getattr(builtins, category, Warning)
        warnings.warn(message, found if isinstance(found, type) and issubclass(found, Warning) else Warning, 1)
