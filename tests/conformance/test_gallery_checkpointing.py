"""Layer 2: gloo worlds of 1-4 ranks. The gallery of checkpointing policies, correct and broken, checked by contract.

Each module under ``tests/forks/gallery_checkpointing_*`` checkpoints the
selected blocks its own way (its docstring names the public pattern;
``docs/ddp.md`` has the table) through every entry point
(``tests/forks/_checkpointing.py``). A row runs the checkpointing checks of
the ddp suite (the hand-made model, structural discovery, the real
``transformers`` models) with the module as ``--ddp`` and, where it applies,
the FSDP2 one with it as ``--fsdp2``, or through ``--ddp-fn MODULE:wrap``:
a correct policy conforms, every checkpointing row passing; a broken one
fails its guarding checks, each failure naming its class as the likely
cause; a fork whose blocks hide their ops from dispatch modes is NOT
APPLICABLE where an op count is read, never FAIL. The gate runs each row
in a world of 2, where the checks cover every scope and mode (the
real-model checks for a few rows: :data:`REAL_IN_GATE`); every row in
worlds of 1-4, every check, is ``thorough``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from nemo_dist.conformance import Report, load_checks, run_checks, select_checks
from nemo_dist.conformance.adapters.wrapping import parse_wrapper
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.conformance.suites.ddp.checkpoint_rules import CAUSES
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

targets.import_target("transformers")

M = "tests.forks.gallery_checkpointing_"
#: The checks every row runs: the ddp and fsdp2 checkpointing checks.
CHECKPOINTING = "checkpointing"
#: The checks that read an op count, which a counter blind to a fork's ops cannot judge.
OP_COUNTED = frozenset({
    "ddp.activation_checkpointing_full",
    "ddp.activation_checkpointing_selective",
    "ddp.selective_checkpointing_saves_matmuls",
    "ddp.checkpointing_real_models",
    "ddp.checkpointing_real_models_beyond_upstream",
    "fsdp2.activation_checkpointing_recomputes_selected_layers",
})
_DDP_CORE = frozenset({
    "ddp.activation_checkpointing_full",
    "ddp.activation_checkpointing_selective",
    "ddp.checkpointing_follows_structural_discovery",
    "ddp.checkpointing_real_models",
})


@dataclass(frozen=True)
class Row:
    """A gallery policy: the core checks it fails (none: it conforms) and the likely cause of each failure."""

    failing: frozenset[str] = frozenset()
    cause: str | None = None


CORRECT = ("docs_policy", "alternating", "torchtitan", "core_attention", "prefer_spellings", "inline", "reentrant",
           "apply_helper")
GALLERY: dict[str, Row] = {
    **{name: Row() for name in CORRECT},
    "wrong_block": Row(_DDP_CORE | {"fsdp2.activation_checkpointing_recomputes_selected_layers"},
                       CAUSES["not_checkpointed"]),
    "changes_gradients": Row(_DDP_CORE | {"fsdp2.activation_checkpointing_recomputes_selected_layers"},
                             CAUSES["gradients"]),
}
#: The broken forks of the bundled component that belong to the gallery's classes, with the cause each names.
BROKEN_FORKS: dict[str, tuple[frozenset[str], str]] = {
    "broken_ddp_selective_saves_every_op": (
        frozenset({"ddp.activation_checkpointing_selective", "ddp.checkpointing_real_models"}),
        CAUSES["recomputes_nothing"],
    ),
    "broken_ddp_selective_is_full": (
        frozenset({"ddp.activation_checkpointing_selective", "ddp.checkpointing_real_models"}),
        CAUSES["recomputes_everything"],
    ),
}

#: Rows whose gate run includes the real-model checks (a model each of transformers' classes costs seconds): the
#: issue's headline policy, the one whose save list needed biased linears named, and reentrant checkpointing
#: (Whisper's encoder once per iteration). Every row runs them in the thorough matrix.
REAL_IN_GATE = frozenset({"docs_policy", "torchtitan", "reentrant"})

_REPORTS: dict[tuple[str, str, tuple[int, ...], bool], tuple[Report, str]] = {}


def _run(
    module: str, how: str, sizes: tuple[int, ...], world_factory: WorldFactory, real: bool = True
) -> tuple[Report, str]:
    """The checkpointing checks of ``module`` as ``--ddp``/``--fsdp2`` (``how="module"``) or ``--ddp-fn``.

    ``real``: with the real-model checks.
    """
    key = (module, how, sizes, real)
    if key not in _REPORTS:
        if how == "module":
            fsdp2 = module if hasattr(__import__(module, fromlist=["_"]), "FSDP2Manager") else None
            impl, components = resolve_implementation(ddp=module, fsdp2=fsdp2)
        else:
            impl, components = resolve_implementation(ddp_wrapper=parse_wrapper(ddp_fn=f"{module}:wrap"))
        validate_implementation(impl)
        checks = select_checks(load_checks().values(), impl, "all", CHECKPOINTING, components)
        checks = [c for c in checks if real or "real_models" not in c.name]
        report = run_checks(checks, impl, sizes, max_examples=2, worlds=world_factory, components=components)
        _REPORTS[key] = (report, format_report(report))
    return _REPORTS[key]


def _sizes(thorough: bool) -> Any:
    return pytest.param((1, 2, 3, 4), id="w1-4", marks=pytest.mark.thorough) if thorough else pytest.param(
        (2,), id="w2"
    )


def _failed_core(report: Report) -> set[str]:
    return {v.check.split("[")[0] for v in report.verdicts if v.failed and v.tier == "core"}


@pytest.mark.parametrize("sizes", [_sizes(False), _sizes(True)])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group(name=f"ckpt_{n}")) for n in GALLERY])
def test_gallery_policy_gets_its_verdict_and_likely_cause(
    name: str, sizes: tuple[int, ...], world_factory: WorldFactory
) -> None:
    """A correct policy passes every checkpointing row (DDP, real models, FSDP2); a broken one fails its guards,
    naming its class; none is judged by the shape of a policy it does not follow."""
    row = GALLERY[name]
    real = len(sizes) > 1 or name in REAL_IN_GATE
    report, table = _run(M + name, "module", sizes, world_factory, real)
    if not real:
        row = Row(row.failing - {"ddp.checkpointing_real_models"}, row.cause)
    assert _failed_core(report) == row.failing, table
    if not row.failing:
        assert report.exit_code(strict=True) == 0, table
        assert all(v.outcome in ("pass", "not applicable") for v in report.verdicts), table
        assert not [v for v in report.verdicts if v.outcome == "not applicable" and "observ" in v.message], table
    else:
        assert report.exit_code() == 1, table
        assert {v.cause for v in report.verdicts if v.failed and v.tier == "core"} == {row.cause}, table
        assert f"Likely cause: {row.cause}" in table


@pytest.mark.parametrize("name", ["docs_policy", "inline", "reentrant"])
def test_gallery_policy_conforms_through_a_wrapper_too(name: str, world_factory: WorldFactory) -> None:
    """The same policy applied by a ``--ddp-fn`` wrapper (torch's DDP around the checkpointed model) conforms."""
    report, table = _run(M + name, "wrapper", (2,), world_factory, real=False)
    assert report.verdicts, table
    assert all(v.outcome == "pass" for v in report.verdicts), table


@pytest.mark.parametrize("fork", list(BROKEN_FORKS))
def test_a_selective_policy_saving_all_or_nothing_names_its_class(fork: str, world_factory: WorldFactory) -> None:
    """Saving every op fails as "recomputes nothing", saving none as "recomputes every op", in the hand-made and
    the real models alike."""
    failing, cause = BROKEN_FORKS[fork]
    report, table = _run(f"tests.forks.{fork}", "module", (2,), world_factory)
    assert _failed_core(report) == failing, table
    assert {v.cause for v in report.verdicts if v.failed and v.tier == "core"} == {cause}, table


def test_a_counter_that_sees_nothing_is_not_applicable_never_a_failure(world_factory: WorldFactory) -> None:
    """A correct fork whose blocks hide their ops from dispatch modes: every row reading an op count is NOT
    APPLICABLE, naming the block whose ops went unseen; no row fails, and none reports "N of its 0"."""
    report, table = _run(M + "blind", "module", (2,), world_factory)
    assert report.exit_code() == 0, table
    assert not [v for v in report.verdicts if v.failed], table
    blind = [v for v in report.verdicts if v.check.split("[")[0] in OP_COUNTED and v.world_size == 2]
    assert blind, table
    for verdict in blind:
        assert verdict.outcome == "not applicable", table
        assert "the op counter saw none of the" in verdict.message, table
        assert "could not be observed" in verdict.message, table
    assert "of its 0" not in table
    assert "fewer than 0" not in table
