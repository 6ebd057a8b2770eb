"""Layer 3: the runner in gloo worlds of 1-3 ranks. Every fork in ``tests/forks`` is run once and judged right.

Each fork (the gallery aside: ``test_gallery.py`` checks those bare callables)
is checked once, through the same selection, runner and table as the
command, and every assertion about it reads that one report:

- a broken fork (``broken_*``) fails, with a message, on the check guarding its
  bug (the message names the broken property) and, where one fits, a likely
  cause; the exit status follows the tier of its failures. Its report holds
  the guarding checks only; a second, cheap run (one unshrunk example per
  check, a world of 2) takes it through every other check of its component,
  proving the tool gives each one a verdict;
- a correct fork conforms; the forks written from the contract alone
  (``independent_*``) pass every check, ``--strict`` included, in worlds of
  1, 2 and 3; an upstream-style gather without ``uneven=`` or ``group=`` gets
  NOT SUPPORTED there, never a failure;
- the upstream-faithful fork (``upstream_faithful_*``, written from
  nemo-automodel 0.7.0's behaviour) conforms, and its failures are exactly
  upstream's extended findings.

The real-transformers checkpointing checks run for the upstream-faithful fork
only (with transformers installed); the reference's are in
``test_every_check.py`` and a broken fork's in ``test_real_models.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import Phase

from nemo_dist.conformance import (
    COMPONENTS,
    REFERENCE,
    Implementation,
    Report,
    cases,
    format_report,
    load_checks,
    run_checks,
)
from nemo_dist.conformance import select_checks as select
from nemo_dist.conformance.engine.profile import changed_profile
from nemo_dist.conformance.engine.target import SUITE_TARGETS
from nemo_dist.conformance.suites.gather.checks import FIXED_IN_PLACE_EXAMPLE
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance._fork_guards import GUARDS, LIKELY_CAUSES

_FORK_FILES = sorted(
    p.stem for p in (Path(__file__).parents[1] / "forks").glob("*.py") if not p.stem.startswith("_")
)


def _component(module: str) -> str:
    fork = importlib.import_module(module)
    for component, names in (
        ("gather", ("all_gather_with_grad",)),
        ("ddp", ("DDPManager", "parallelize_ddp")),
        ("config", ("DDPConfig",)),
        ("fsdp2", ("FSDP2Manager", "fsdp2_strategy_parallelize")),
        ("tp", ("parallelize_tp",)),
        ("a2a", ("all_to_all_with_grad",)),
    ):
        if any(hasattr(fork, n) for n in names):
            return component
    raise AssertionError(
        f"{module} provides none of all_gather_with_grad, DDPManager, parallelize_ddp, DDPConfig, FSDP2Manager, "
        "parallelize_tp, all_to_all_with_grad"
    )


def _alone(fork: str) -> tuple[Implementation, tuple[str, ...]]:
    """The fork as its component, the bundled modules serving the others."""
    module = f"tests.forks.{fork}"
    component = _component(module)
    paths = {c: getattr(REFERENCE, c) for c in COMPONENTS if c not in SUITE_TARGETS}
    if component in SUITE_TARGETS:  # a suite's own component: its module is a suite option
        return Implementation(**paths, suite_options=((SUITE_TARGETS[component].module_field, module),)), (component,)
    return Implementation(**{**paths, component: module}), (component,)


def _trio(prefix: str) -> tuple[Implementation, tuple[str, ...]]:
    """The three forks ``PREFIX_{gather,ddp,config}`` together, every component checked."""
    gather = f"tests.forks.{prefix}_dist_utils" if prefix == "upstream_faithful" else f"tests.forks.{prefix}_gather"
    impl = Implementation(gather=gather, ddp=f"tests.forks.{prefix}_ddp", config=f"tests.forks.{prefix}_config")
    return impl, ("gather", "ddp", "config")


#: Fork -> (implementation, components checked, world sizes). Each one runs once.
TARGETS: dict[str, tuple[Implementation, tuple[str, ...], tuple[int, ...]]] = {
    **{f: (*_alone(f), (2,)) for f in _FORK_FILES if f.startswith("broken_")},
    "upstream_style_gather": (*_alone("upstream_style_gather"), (2, 3)),
    "independent": (*_trio("independent"), (1, 2, 3)),
    "upstream_faithful": (*_trio("upstream_faithful"), (1, 2)),
    "upstream_faithful_bf16_ddp": (*_alone("upstream_faithful_bf16_ddp"), (1,)),
}
#: Broken forks whose bug needs a subgroup, which the group checks make in worlds of 3 or more.
for _fork in ("broken_gather_group_rank_from_first_member", "broken_gather_uneven_group_global_rank"):
    TARGETS[_fork] = (*_alone(_fork), (3,))
#: A fork that checkpoints only in worlds of 2 or fewer: run where the checks are thorough (2) and sample (3).
_SIZED = "broken_ddp_no_checkpointing_beyond_two_ranks"
TARGETS[_SIZED] = (*_alone(_SIZED), (2, 3))
#: Broken FSDP2 forks whose bug is in HSDP, which the fsdp2 checks run in worlds of 4.
for _fork in ("broken_fsdp2_hsdp_replicas_unsynced", "broken_fsdp2_mesh_dims_swapped"):
    TARGETS[_fork] = (*_alone(_fork), (4,))
COVERED = {f for f in _FORK_FILES if f.startswith(("broken_", "independent_", "upstream_faithful_"))} | {
    "upstream_style_gather"
}

#: What upstream does not promise, as (check, world size) failures of the extended tier in worlds of 0 and 1.
UPSTREAM_EXTENDED_FINDINGS = {
    ("gather.uninitialised_no_grad_never_requires_grad", 0),  # all_gather_no_grad returns x itself
    ("config.rejects_bad_values_naming_field", 0),  # a plain dataclass: only the scope is validated
    ("config.valid_values_normalised", 0),  # and stored, the rest as given: "Selective", dtype names stay str
    ("gather.no_grad_never_requires_grad", 1),  # x itself in a world of one
    ("gather.zero_dim_raises_on_every_rank", 1),
    ("ddp.world_of_one_wrapped_in_ddp[parallelize_ddp]", 1),  # the model comes back unwrapped
    ("ddp.world_of_one_wrapped_in_ddp[DDPManager]", 1),
    ("ddp.autocast_dtype[parallelize_ddp]", 1),  # the field exists; nothing applies it
    ("ddp.autocast_dtype[DDPManager]", 1),
}

#: Whisper's encoder is the audio group beyond upstream: a finding where transformers is installed, in every
#: world the upstream-faithful fork runs.
WHISPER_FINDINGS = (
    {
        (f"ddp.checkpointing_real_models_beyond_upstream[{api}]", size)
        for api in ("parallelize_ddp", "DDPManager")
        for size in TARGETS["upstream_faithful"][2]
    }
    if importlib.util.find_spec("transformers") is not None
    else set()
)

#: Forks whose backward changes the caller's contiguous upstream gradient in place -> world size -> whether the
#: in-place check fails there (in a world of one they return x itself: no backward of theirs runs).
IN_PLACE_GRADIENT = {
    fork: {1: False, 2: True, 3: True, 4: True}
    for fork in ("broken_gather_mutates_grad", "broken_gather_reduces_grad_in_place")
}
#: Hypothesis settings and seed the in-place check must catch them under: its own examples off, a fixed
#: seed, a fresh random one (a run is drawn from its seed whatever the active profile's derandomize says).
HYPOTHESIS_VARIANTS: dict[str, tuple[dict[str, Any], int | None]] = {
    "generation_off": ({"phases": [Phase.explicit]}, None),
    "seed_0": ({}, 0),
    "random": ({}, None),
}

_REPORTS: dict[str, tuple[Report, str]] = {}


def _report(name: str, world_factory: WorldFactory) -> tuple[Report, str]:
    """The one report of fork ``name`` in this process (run on first use) and its table.

    A broken fork runs the checks guarding its bug (``GUARDS``), every example
    and shrinking included; every other fork runs its whole component.
    """
    if name not in _REPORTS:
        impl, components, sizes = TARGETS[name]
        selected = select(load_checks().values(), impl, "all", None, components)
        checks = [c for c in selected if name == "upstream_faithful" or "real_models" not in c.name]
        if name in GUARDS:
            checks = [c for c in checks if c.name in {check for check, _ in GUARDS[name]}]
        report = run_checks(checks, impl, sizes, max_examples=5, worlds=world_factory, components=components)
        _REPORTS[name] = (report, format_report(report))
    return _REPORTS[name]


def _params(names: Any, thorough: frozenset[str] = frozenset()) -> list[Any]:
    # Every test of one fork in one xdist worker, so the fork runs once; those in `thorough` marked so.
    return [
        pytest.param(
            n,
            id=n,
            marks=[pytest.mark.xdist_group(name=f"fork_{n}"), *([pytest.mark.thorough] if n in thorough else [])],
        )
        for n in names
    ]


def test_every_fork_file_is_judged() -> None:
    """Each non-gallery fork under tests/forks is one of the targets here (a new fork cannot be forgotten)."""
    assert {f for f in _FORK_FILES if not f.startswith("gallery_")} == COVERED
    assert set(GUARDS) == {f for f in _FORK_FILES if f.startswith("broken_")}


@pytest.mark.parametrize("fork", _params(GUARDS))
def test_broken_fork_fails_its_guarding_check_with_a_readable_failure(fork: str, world_factory: WorldFactory) -> None:
    """The guarding check FAILs naming the broken property (with its likely cause where one fits); exit follows tier."""
    report, table = _report(fork, world_factory)
    failures = [v for v in report.verdicts if v.failed]
    assert failures, table
    assert all(v.message for v in failures), table
    for check, message in GUARDS[fork]:
        guarded = [v for v in failures if v.check.split("[")[0] == check]
        assert guarded, f"{check} did not fail\n{table}"
        assert any(re.search(message, v.message) for v in guarded), f"{check}: no message matches {message!r}\n{table}"
    if fork in LIKELY_CAUSES:
        assert any(v.cause.startswith(LIKELY_CAUSES[fork]) for v in failures), table
    if any(v.tier == "core" for v in failures):
        assert report.exit_code() == 1, table
    else:  # an extended-tier bug blocks only a strict run
        assert (report.exit_code(), report.exit_code(strict=True)) == (0, 1), table


#: Broken forks left out of the cheap run of every check: their ranks crash in every backward, so each check
#: would only replace the world again; the crash tests below prove what the tool makes of that crash.
CRASHING = frozenset({"broken_gather_backward_segfaults"})
#: Broken DDP, FSDP2 and TP forks that are the reference with one field or one piece handled wrong: their run of
#: every check shows no more of the tool than broken_ddp_drops_bucket_cap's (broken_fsdp2_root_resharded's,
#: broken_tp_gathered_norm_keeps_shard's) does, and costs seconds each, so it is thorough (--thorough).
ONE_FIELD_DDP_FORKS = frozenset(
    f for f in GUARDS if f.startswith(("broken_ddp_", "broken_fsdp2_", "broken_tp_"))
) - {
    "broken_ddp_drops_bucket_cap",
    "broken_ddp_forward_sync_buffers",
    "broken_ddp_no_checkpointing",
    "broken_fsdp2_root_resharded",
    "broken_tp_gathered_norm_keeps_shard",
}


@pytest.mark.parametrize("fork", _params(sorted(set(GUARDS) - CRASHING), thorough=ONE_FIELD_DDP_FORKS))
def test_broken_fork_gets_a_verdict_on_every_check_of_its_component(fork: str, world_factory: WorldFactory) -> None:
    """Every check of the fork's component runs once, unshrunk, in its largest world (2; 3 or 4 for a bug there).

    The guard test judges the fork on its guarding checks; this cheap run
    proves the tool itself copes with the fork everywhere else (a verdict per
    run, a message on every failure, a table that lists them all).
    """
    impl, components, sizes = TARGETS[fork]
    checks = [c for c in select(load_checks().values(), impl, "all", None, components) if "real_models" not in c.name]
    with changed_profile(phases=[Phase.explicit, Phase.generate]):
        report = run_checks(checks, impl, sizes[-1:], max_examples=1, worlds=world_factory, components=components)
    table = format_report(report)
    expected = [case.name for case in cases(checks, impl, sizes[-1:])]
    assert sorted(v.check for v in report.verdicts) == sorted(expected), table
    explained = [v for v in report.verdicts if v.outcome in ("fail", "hang", "not supported", "not applicable")]
    assert all(v.message for v in explained), table
    assert report.exit_code(strict=True) == 1, table
    for name in expected:
        assert name in table, table


@pytest.mark.parametrize("fork", _params(["broken_ddp_no_checkpointing_beyond_two_ranks"]))
def test_a_fork_checkpointing_differently_with_more_ranks_fails_where_the_checks_sample(
    fork: str, world_factory: WorldFactory
) -> None:
    """The whole matrix passes in the world of 2 (the fork checkpoints there); the sample fails it in the world of 3."""
    report, table = _report(fork, world_factory)
    outcomes = {(v.check, v.world_size): v.outcome for v in report.verdicts if v.check.endswith("[DDPManager]")}
    assert outcomes == {
        (f"ddp.activation_checkpointing_{mode}[DDPManager]", size): "pass" if size == 2 else "fail"
        for mode in ("full", "selective")
        for size in (2, 3)
    }, table


@pytest.mark.parametrize("fork", _params(["broken_gather_uneven_group_global_rank"]))
def test_the_subgroup_global_rank_cause_is_named_from_the_fixed_interleaved_example(
    fork: str, world_factory: WorldFactory
) -> None:
    """The cause of the check's fixed example ({0, 2} and {1}, which runs when hypothesis found nothing) is named:
    {1} gathers nothing, so it is right whatever rank it reads (a random seed once drew that path, causeless)."""
    from nemo_dist.conformance.suites.gather.diagnosis import CAUSES
    from nemo_dist.conformance.suites.gather.group_diagnosis import uneven_group_cause
    from nemo_dist.conformance.suites.gather.properties import interleaved_partition

    impl, _, _ = TARGETS[fork]
    example = {"shape": (1, 3), "dtype": torch.float32, "partition": interleaved_partition(3)}
    assert uneven_group_cause(world_factory(3), impl, example) == CAUSES["subgroup_global_rank"]


@pytest.mark.parametrize("fork", _params(["broken_gather_backward_segfaults"]))
def test_a_crashed_rank_is_reported_as_its_crash_with_its_stack_and_no_likely_cause(
    fork: str, world_factory: WorldFactory
) -> None:
    """A backward killing its process (SIGSEGV): "rank R crashed", its stderr tail with the fork's line, no cause."""
    report, table = _report(fork, world_factory)
    crashed = [v for v in report.verdicts if v.failed and "crashed: killed by signal SIGSEGV" in v.message]
    assert crashed, table
    assert all(v.cause == "" for v in report.verdicts), table
    assert "Likely cause" not in table
    line = _line_of(fork, "os.kill(os.getpid(), signal.SIGSEGV)")
    assert f'{fork}.py", line {line} in backward' in crashed[0].traceback, table
    assert "Fatal Python error: Segmentation fault" in crashed[0].traceback, table


@pytest.mark.parametrize("fork", _params(["broken_gather_backward_views_grad"]))
def test_an_error_raised_in_the_forks_own_code_shows_its_file_and_line(fork: str, world_factory: WorldFactory) -> None:
    """The failure's traceback keeps the fork's frame (file, line, source), the tool's frames folded."""
    _, table = _report(fork, world_factory)
    line = _line_of(fork, "flat = grad.view(-1)")
    assert f'{fork}.py", line {line}, in backward\n    flat = grad.view(-1)' in table, table
    assert " tool frames" in table, table
    assert "nemo_dist/testing/_rank.py" not in table, table


def _line_of(fork: str, code: str) -> int:
    """The line number of ``code`` in the fork's file."""
    lines = (Path(__file__).parents[1] / "forks" / f"{fork}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if code in line)


@pytest.mark.parametrize("fork", _params(["independent"]))
def test_forks_written_from_the_spec_pass_every_check_strictly(fork: str, world_factory: WorldFactory) -> None:
    """independent_{gather,ddp,config} pass every check in worlds of 1, 2 and 3 (exit 0 under --strict)."""
    report, table = _report(fork, world_factory)
    assert report.exit_code(strict=True) == 0, table
    assert report.count("pass") > 0, table


@pytest.mark.parametrize("fork", _params(["upstream_style_gather"]))
def test_upstream_style_gather_conforms_and_its_missing_keywords_are_not_supported(
    fork: str, world_factory: WorldFactory
) -> None:
    """A gather without uneven=/group= conforms; the checks needing them say NOT SUPPORTED, naming the keyword."""
    report, table = _report(fork, world_factory)
    assert report.exit_code() == 0, table
    unsupported = {v.check: v.message for v in report.verdicts if v.outcome == "not supported"}
    needs = (
        ("gather.uneven_gathers_rows_in_rank_order", "uneven"),
        ("gather.group_uses_group_ranks", "group"),
        ("gather.uneven_with_group_gathers_group_rows", "group"),
        ("gather.uneven_no_grad_gathers_integers_and_bools", "uneven"),
    )
    for check, keyword in needs:
        assert f"takes no {keyword}= keyword" in unsupported.get(check, ""), table


@pytest.mark.parametrize("fork", _params(["upstream_faithful"]))
def test_upstream_faithful_fork_conforms_and_reports_upstreams_extended_findings(
    fork: str, world_factory: WorldFactory
) -> None:
    """It passes every core check; in worlds of 0 and 1 its failures are exactly upstream's extended findings."""
    report, table = _report(fork, world_factory)
    assert report.exit_code() == 0, table
    assert all(v.tier == "extended" and v.message for v in report.verdicts if v.failed), table
    small = {
        (v.check, v.world_size)
        for v in report.verdicts
        if v.failed and v.world_size <= 1 and "real_models" not in v.check
    }
    assert small == UPSTREAM_EXTENDED_FINDINGS, table
    real_models = {(v.check, v.world_size) for v in report.verdicts if v.failed and "real_models" in v.check}
    assert real_models == WHISPER_FINDINGS, table
    not_applicable = {v.check.split("[")[0] for v in report.verdicts if v.outcome == "not applicable"}
    assert {"ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view", "ddp.static_graph"} <= not_applicable, table
    assert "DeprecationWarning: DDPManager is deprecated" in table
    # No DDP in a world of one is its own choice (the contract wraps there too): not applicable, blocking --strict.
    chosen = {(v.check.split("[")[0], v.world_size) for v in report.verdicts if v.chosen}
    assert ("ddp.bucket_cap_mb", 1) in chosen, table
    assert all(v.outcome == "not applicable" and v.world_size == 1 for v in report.verdicts if v.chosen), table
    assert report.exit_code(strict=True) == 1, table


@pytest.mark.parametrize("fork", _params(["upstream_faithful_bf16_ddp"]))
def test_entry_point_casting_to_bfloat16_conforms_compared_in_its_dtype(fork: str, world_factory: WorldFactory) -> None:
    """A world-of-one entry point that casts the model to bfloat16 (upstream on CUDA) conforms: no dtype crash."""
    report, table = _report(fork, world_factory)
    assert report.exit_code() == 0, table
    assert "must have the same dtype" not in table


@pytest.mark.parametrize("variant", list(HYPOTHESIS_VARIANTS))
@pytest.mark.parametrize("fork", list(IN_PLACE_GRADIENT))
def test_in_place_gradient_change_is_caught_at_every_world_size_whatever_hypothesis_draws(
    fork: str, variant: str, world_factory: WorldFactory
) -> None:
    """The in-place check fails at world sizes 2, 3 and 4 on its fixed first example, with one or no drawn example."""
    impl, components, _ = TARGETS[fork]
    checks = select(load_checks().values(), impl, "core", "inputs_and_grads_not_modified", components)
    changes, seed = HYPOTHESIS_VARIANTS[variant]
    with changed_profile(**changes):
        report = run_checks(
            checks, impl, (1, 2, 3, 4), max_examples=1, worlds=world_factory, components=components, seed=seed
        )
    table = format_report(report)
    failed = {v.world_size: v.failed for v in report.verdicts}
    assert failed == IN_PLACE_GRADIENT[fork], table
    for verdict in report.verdicts:
        if verdict.failed:
            assert "the upstream gradient passed to out.backward(g) was modified in place" in verdict.message, table
            assert verdict.example == FIXED_IN_PLACE_EXAMPLE, table
