"""Layer 0: no processes. The verdict table, JUnit XML, exit codes and check selection, on hand-made verdicts."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from nemo_dist.conformance import REFERENCE, Check, Implementation, NotSupported, Report, Verdict, select_checks
from nemo_dist.conformance.engine.explain import Finding, fold_tool_frames
from nemo_dist.conformance.engine.junit import write_junit_xml
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.verdicts import is_not_supported
from nemo_dist.testing import RankFailure


def _verdict(check: str, outcome: str, tier: str = "core", size: int = 2, **kw: Any) -> Verdict:
    return Verdict(check, "gather", tier, size, outcome, 0.5, **kw)  # type: ignore[arg-type]


def _report(*verdicts: Verdict) -> Report:
    return Report(tuple(verdicts), REFERENCE, "gloo", "all", 5, 1.0)


FAIL = _verdict(
    "gather.forward",
    "fail",
    message="AssertionError: rank 0: shape (2,), expected (3,)\n" + "\n".join(f"line {i}" for i in range(30)),
    example="Failing test case: prop(\n    x=0,\n)",
)


def test_table_has_a_row_per_check_and_size_ordered_by_check() -> None:
    """Rows come in check order then size, each with tier, verdict and time."""
    report = _report(_verdict("b.second", "pass", size=2), _verdict("a.first", "pass", size=3),
                     _verdict("b.second", "pass", size=3))
    lines = format_report(report).splitlines()
    rows = [line.split() for line in lines if line.startswith(("a.", "b."))]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("b.second", "2", "core", "PASS"),
        ("b.second", "3", "core", "PASS"),
        ("a.first", "3", "core", "PASS"),
    ]
    assert "CONFORMS (exit 0)" in lines[-1]


def test_failure_section_shows_example_and_first_ten_message_lines() -> None:
    """A failure lists its shrunk example and the first ten lines of its message, then a count of the rest."""
    text = format_report(_report(FAIL))
    assert "Failing test case: prop(\n    x=0,\n)" in text
    assert "AssertionError: rank 0: shape (2,), expected (3,)" in text
    assert "line 8" in text
    assert "line 9" not in text
    assert "... (21 more lines)" in text
    assert "DOES NOT CONFORM (exit 1)" in text


@pytest.mark.parametrize(
    ("verdicts", "strict", "code"),
    [
        ((FAIL,), False, 1),
        ((_verdict("x", "fail", tier="extended"),), False, 0),
        ((_verdict("x", "fail", tier="extended"),), True, 1),
        ((_verdict("x", "not supported", tier="extended"),), False, 0),
        ((_verdict("x", "not supported", tier="extended"),), True, 1),
        ((_verdict("x", "skipped"), _verdict("y", "pass")), True, 0),
        ((_verdict("x", "not applicable"),), True, 0),
        ((_verdict("x", "not applicable", chosen=True),), False, 0),
        ((_verdict("x", "not applicable", chosen=True),), True, 1),
    ],
    ids=["core-fail", "extended-fail", "extended-fail-strict", "not-supported", "not-supported-strict", "skip-strict",
         "not-applicable-strict", "chosen-not-applicable", "chosen-not-applicable-strict"],
)
def test_exit_code_blocks_on_core_failures_or_anything_under_strict(
    verdicts: tuple[Verdict, ...], strict: bool, code: int
) -> None:
    """Core failures exit 1; extended failures, not-supported and a not-applicable the code chose only under
    --strict (a not-applicable of the world size never)."""
    assert _report(*verdicts).exit_code(strict) == code


def test_junit_xml_counts_tests_failures_and_skips(tmp_path: Path) -> None:
    """JUnit XML has one testcase per row, failure elements for failures, skipped for the rest."""
    path = tmp_path / "report.xml"
    report = _report(FAIL, _verdict("b", "pass"), _verdict("c", "not supported", tier="extended", message="no uneven="),
                     _verdict("d", "skipped"))
    write_junit_xml(report, path)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "2")
    failure = suite.find("testcase[@name='gather.forward[w2]']/failure")
    assert failure is not None
    assert failure.get("message") == "AssertionError: rank 0: shape (2,), expected (3,)"
    assert failure.text is not None
    assert "x=0" in failure.text


def test_junit_xml_strict_turns_not_supported_into_failures(tmp_path: Path) -> None:
    """Under --strict a not-supported check is a JUnit failure, as it is for the exit code."""
    path = tmp_path / "report.xml"
    write_junit_xml(_report(_verdict("c", "not supported", tier="extended")), path, strict=True)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "0")


def _noop(world: object, impl: object) -> None:
    """Does nothing."""


CHECKS = [
    Check("g.core", "core", "gather", _noop),
    Check("g.ext", "extended", "gather", _noop),
    Check("d.core", "core", "ddp", _noop),
    Check("c.ext", "extended", "config", _noop),
]


@pytest.mark.parametrize(
    ("impl", "tier", "select", "names"),
    [
        (REFERENCE, "all", None, ["g.core", "g.ext", "d.core", "c.ext"]),
        (REFERENCE, "core", None, ["g.core", "d.core"]),
        (REFERENCE, "extended", None, ["g.ext", "c.ext"]),
        (Implementation(gather="m", ddp=None, config=None), "all", None, ["g.core", "g.ext"]),
        (REFERENCE, "all", "core", ["g.core", "d.core"]),
        (REFERENCE, "all", "not core", ["g.ext", "c.ext"]),
    ],
    ids=["all", "core", "extended", "gather-only", "select", "select-not"],
)
def test_select_checks_filters_by_tier_component_and_name(
    impl: Implementation, tier: str, select: str | None, names: list[str]
) -> None:
    """Only checks of the tier, of a named component, and containing the selected text run."""
    assert [c.name for c in select_checks(CHECKS, impl, tier, select)] == names


def test_select_checks_rejects_an_unknown_tier() -> None:
    """An unknown tier is a ValueError naming the choices."""
    with pytest.raises(ValueError, match="core, extended, all"):
        select_checks(CHECKS, REFERENCE, "nightly")


def test_not_supported_is_recognised_in_the_parent_or_on_every_failing_rank() -> None:
    """NotSupported counts when raised here or by every failing rank, not when one rank failed otherwise."""
    assert is_not_supported(NotSupported("no group="))
    assert is_not_supported(RankFailure({0: "rank 0 raised NotSupported: x", 1: "rank 1 raised NotSupported: x"}))
    assert not is_not_supported(RankFailure({0: "rank 0 raised NotSupported: x", 1: "rank 1 raised ValueError: y"}))
    assert not is_not_supported(AssertionError("x"))


def test_hang_is_a_failure_with_its_own_label_and_every_line_of_its_stacks() -> None:
    """A hang shows HANG (blocking like a failure), the hung step and its whole message, not ten lines of it."""
    stacks = "\n".join(f"frame {i}" for i in range(20))
    hang = _verdict("gather.group", "hang", tier="core", message=f"deadline 10 s\n{stacks}", example="Hung step: f()")
    text = format_report(_report(hang))
    assert "gather.group  2      core  HANG" in text
    assert "--- gather.group (world size 2, core tier, HANG) ---" in text
    assert "Hung step: f()" in text
    assert "frame 19" in text
    assert "0 passed, 0 failed, 1 hung" in text
    assert _report(hang).exit_code() == 1


def test_likely_cause_is_printed_under_the_failure_and_in_junit(tmp_path: Path) -> None:
    """A failure's likely cause is one line right under its heading, and the first line of its JUnit text."""
    failed = _verdict("gather.backward", "fail", message="AssertionError: x", cause="no cross-rank sum")
    text = format_report(_report(failed))
    heading = text.splitlines().index("--- gather.backward (world size 2, core tier) ---")
    assert text.splitlines()[heading + 1] == "Likely cause: no cross-rank sum"
    path = tmp_path / "report.xml"
    write_junit_xml(_report(failed), path)
    failure = ET.parse(path).getroot().find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.text is not None
    assert failure.text.startswith("Likely cause: no cross-rank sum")


def test_checks_without_a_world_show_a_dash_and_reasons_are_grouped_per_check() -> None:
    """World size 0 prints "-"; not-applicable rows of one check and reason are listed once with their sizes."""
    report = _report(
        _verdict("config.defaults", "pass", size=0),
        *(_verdict("ddp.buckets", "not applicable", size=s, message="NotApplicable: no DDP object") for s in (1, 2)),
    )
    text = format_report(report)
    assert "config.defaults  -      core  PASS" in text
    assert "  ddp.buckets (w1, w2): no DDP object" in text
    assert "2 not applicable" in text.splitlines()[-1]


def test_warnings_are_listed_once_under_the_table_with_where_they_came_from() -> None:
    """Each distinct warning raised inside the checks is one note naming its first check and how many more."""
    warned = ("DeprecationWarning: DDPManager is deprecated",)
    report = _report(*(_verdict(f"ddp.c{i}", "pass", warnings=warned) for i in range(3)))
    text = format_report(report)
    assert "Warnings raised inside the checks (notes, not failures)" in text
    assert "  DeprecationWarning: DDPManager is deprecated [ddp.c0 w2 and 2 more]" in text
    assert report.exit_code(strict=True) == 0


def test_extended_failures_are_counted_apart_in_the_summary() -> None:
    """The summary says how many failures are extended, so a CONFORMS line with failures reads right."""
    text = format_report(_report(_verdict("x", "fail", tier="extended"), _verdict("y", "pass")))
    assert text.splitlines()[-1].startswith("1 passed, 1 failed (1 extended) in ")
    assert "CONFORMS (exit 0)" in text


RANK_TRACEBACK = """Traceback (most recent call last):
  File "/site/nemo_dist/testing/_rank.py", line 80, in _answer
    value: Any = fn(*args, **kwargs)
                 ^^^^^^^^^^^^^^^^^^^
  File "/site/nemo_dist/conformance/suites/gather/ranks.py", line 120, in backward
    out.backward(g)
  File "/site/torch/_tensor.py", line 623, in backward
    torch.autograd.backward(
  File "/home/me/project/losses.py", line 31, in backward
    flat = grad.view(size, -1)
           ^^^^^^^^^^^^^^^^^^^
RuntimeError: view size is not compatible"""


def test_tool_frames_fold_into_one_line_and_the_code_under_test_stays() -> None:
    """The tool's own frames become "... N tool frames"; torch's and the user's frames are kept with their lines."""
    folded = fold_tool_frames(RANK_TRACEBACK).splitlines()
    assert folded == [
        "Traceback (most recent call last):",
        "  ... 2 tool frames",
        '  File "/site/torch/_tensor.py", line 623, in backward',
        "    torch.autograd.backward(",
        '  File "/home/me/project/losses.py", line 31, in backward',
        "    flat = grad.view(size, -1)",
        "           ^^^^^^^^^^^^^^^^^^^",
        "RuntimeError: view size is not compatible",
    ]


def test_a_long_message_is_cut_but_the_traceback_of_the_code_under_test_is_shown_whole() -> None:
    """The message stops after MESSAGE_LINES lines; the traceback under it keeps the user's failing line."""
    failed = _verdict(
        "gather.backward", "fail", message="\n".join(f"line {i}" for i in range(30)),
        traceback=fold_tool_frames(RANK_TRACEBACK),
    )
    text = format_report(_report(failed))
    assert "line 9" in text
    assert "line 10" not in text
    assert '  File "/home/me/project/losses.py", line 31, in backward\n    flat = grad.view(size, -1)' in text


def test_each_finding_is_listed_with_its_cause_example_and_message() -> None:
    """A verdict of several distinct failures prints each one, numbered, with its own cause, example and message."""
    findings = (
        Finding("AssertionError: even", "Failing test case: prop(x=0)", "no cross-rank sum"),
        Finding("RankFailure: 2 of 2 rank(s) failed", "Failing test case: prop(x=1)", "", "--- rank 0 ---\nTB"),
    )
    failed = _verdict("gather.backward", "fail", message="Hypothesis found 2 distinct failures.", findings=findings)
    lines = format_report(_report(failed)).splitlines()
    start = lines.index("--- gather.backward (world size 2, core tier) ---")
    assert lines[start + 1 : start + 12] == [
        "Hypothesis found 2 distinct failures.",
        "[1 of 2]",
        "Likely cause: no cross-rank sum",
        "Failing test case: prop(x=0)",
        "AssertionError: even",
        "[2 of 2]",
        "Failing test case: prop(x=1)",
        "RankFailure: 2 of 2 rank(s) failed",
        "--- rank 0 ---",
        "TB",
        "",
    ]


def test_a_report_with_its_command_prints_a_reproduce_line_per_failure() -> None:
    """Each failure ends with the command, the exact check, its size and the run's seed; none without a command."""
    failed = _verdict("ddp.bucket_cap_mb[DDPManager]", "fail", message="AssertionError: x")
    report = dataclasses.replace(_report(failed), seed=42, command="nemo-dist-conformance --ddp my.ddp")
    assert (
        "Reproduce: nemo-dist-conformance --ddp my.ddp --check 'ddp.bucket_cap_mb[DDPManager]' --world-sizes 2 "
        "--seed 42" in format_report(report)
    )
    assert "seed=42" in format_report(report).splitlines()[1]
    assert "Reproduce:" not in format_report(_report(failed))
