"""Layer 0: no processes. What a run gives CI and bug reports: JUnit that agrees with the exit status, a JSON
report of a fixed schema, the versions verdicts depend on, ``--version``, ``--list-checks`` and a ``--help``
grouped by suite.

Reports are hand-made (every outcome, each tier) where the files are judged; the command is called in this
process (``main(argv)``) on checks that need no process group.
"""

from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dist.conformance import REFERENCE, Report, Verdict
from nemo_dist.conformance.engine.json_report import OUTCOMES, SCHEMA, report_json
from nemo_dist.conformance.engine.junit import junit_xml
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.versions import package_version
from nemo_dist.conformance.frontends.cli import main


def _verdict(check: str, outcome: str, tier: str = "core", **kw: Any) -> Verdict:
    return Verdict(check, "gather", tier, 2, outcome, 0.25, **kw)  # type: ignore[arg-type]


#: Every outcome, and a failure of each tier: a run that conforms (exit 0) outside --strict.
CONFORMING = Report(
    (
        _verdict("gather.a", "pass"),
        _verdict("gather.b", "fail", tier="extended", message="AssertionError: off by 1", cause="a cause"),
        _verdict("gather.c", "not applicable", message="runs in worlds of 2 or more ranks"),
        _verdict("gather.d", "not supported", tier="extended", message="no uneven="),
        _verdict("gather.e", "skipped", message="not selected"),
    ),
    REFERENCE, "gloo", "all", 5, 1.5, command="nemo-dist-conformance",
)
#: A run that does not conform: a core failure and a hang.
FAILING = Report(
    (_verdict("gather.a", "fail", message="AssertionError: wrong"),
     _verdict("gather.b", "hang", message="StepHung: ranks 0, 1 stuck")),
    REFERENCE, "gloo", "all", 5, 1.5, command="nemo-dist-conformance",
)


def _cases(tree: ET.ElementTree) -> dict[str, ET.Element]:
    return {case.get("name", "").split("[")[0]: case for case in tree.getroot().iter("testcase")}


def _outcome(case: ET.Element) -> str | None:
    return next((p.get("value") for p in case.iter("property") if p.get("name") == "outcome"), None)


def test_a_conforming_run_has_no_failure_in_junit_and_its_extended_finding_stays_readable() -> None:
    """Exit 0 and no ``failure`` or ``error``: the extended finding is the testcase's system-out, with its cause."""
    tree = junit_xml(CONFORMING)
    assert CONFORMING.exit_code() == 0
    assert list(tree.getroot().iter("failure")) == []
    assert list(tree.getroot().iter("error")) == []
    suite = tree.getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("0", "0", "3")
    finding = _cases(tree)["gather.b"].find("system-out")
    assert finding is not None
    assert finding.text is not None
    assert finding.text.startswith("fail (extended tier, does not block): AssertionError: off by 1")
    assert "Likely cause: a cause" in finding.text


def test_strict_makes_the_extended_finding_and_not_supported_failures_as_the_exit_status_does() -> None:
    tree = junit_xml(CONFORMING, strict=True)
    assert CONFORMING.exit_code(strict=True) == 1
    assert {c.get("name", "").split("[")[0] for c in tree.getroot().iter("testcase") if c.find("failure") is not None} \
        == {"gather.b", "gather.d"}


def test_a_hang_is_a_junit_error_and_a_failure_a_failure() -> None:
    cases = _cases(junit_xml(FAILING))
    failure, error = cases["gather.a"].find("failure"), cases["gather.b"].find("error")
    assert failure is not None
    assert failure.get("type") == "fail"
    assert error is not None
    assert error.get("type") == "hang"
    assert error.get("message") == "StepHung: ranks 0, 1 stuck"
    assert cases["gather.b"].find("failure") is None


def test_not_applicable_not_supported_and_skipped_are_told_apart_in_junit() -> None:
    cases = _cases(junit_xml(CONFORMING))
    for check, outcome in (("gather.c", "not applicable"), ("gather.d", "not supported"), ("gather.e", "skipped")):
        skipped = cases[check].find("skipped")
        assert skipped is not None
        assert skipped.get("type") == outcome
        assert _outcome(cases[check]) == outcome


def test_junit_properties_carry_the_versions_backend_and_exit_status() -> None:
    suite = junit_xml(FAILING).getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.find("properties") or ()}
    assert props["torch"] == torch.__version__
    assert props["python"] == platform.python_version()
    assert props["nemo_dist"] == package_version("nemo-dist")
    assert (props["backend"], props["exit_code"]) == ("gloo", "1")


#: The JSON schema (``docs/ci.md``), as field -> type; a nested dict is an object of those fields.
_VERDICT = {"check": str, "component": str, "tier": str, "world_size": int, "outcome": str, "blocking": bool,
            "message": str, "likely_cause": str, "example": str, "reproduce": str, "seconds": float,
            "findings": list, "warnings": list}
_DOCUMENT = {
    "schema": str,
    "header": {"components": dict, "checked": list, "backend": str, "tier": str, "max_examples": (int, type(None)),
               "seed": (int, type(None)), "strict": bool, "versions": dict, "notes": list, "command": str},
    "summary": {"exit_code": int, "conforms": bool, "seconds": float, "counts": dict},
    "verdicts": list,
}


def _conforms_to(value: Any, schema: Any, where: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (exactly these keys, each of its type), as ``$.header.tier`` paths."""
    if isinstance(schema, dict):
        if not isinstance(value, dict) or set(value) != set(schema):
            return [f"{where}: keys {sorted(value) if isinstance(value, dict) else type(value)} != {sorted(schema)}"]
        return [e for key, sub in schema.items() for e in _conforms_to(value[key], sub, f"{where}.{key}")]
    return [] if isinstance(value, schema) else [f"{where}: {type(value).__name__} is not {schema}"]


@pytest.mark.parametrize(("report", "strict"), [(CONFORMING, False), (CONFORMING, True), (FAILING, False)],
                         ids=["conforming", "conforming-strict", "failing"])
def test_the_json_report_keeps_its_schema_and_agrees_with_the_exit_status(report: Report, strict: bool) -> None:
    """Every field of the documented schema, of its type, through a JSON round trip; ``blocking`` marks exactly
    what the exit status counts, and the counts are the report's."""
    document = json.loads(json.dumps(report_json(report, strict)))
    assert _conforms_to(document, _DOCUMENT) == []
    assert [e for v in document["verdicts"] for e in _conforms_to(v, _VERDICT)] == []
    assert document["schema"] == SCHEMA
    assert set(document["summary"]["counts"]) == set(OUTCOMES)
    assert document["summary"]["exit_code"] == report.exit_code(strict)
    assert [v["blocking"] for v in document["verdicts"]] == [v in report.blocking(strict) for v in report.verdicts]
    assert {v["outcome"] for v in document["verdicts"]} <= set(OUTCOMES)
    assert document["header"]["versions"]["torch"] == torch.__version__


#: The versions every report starts with (a test target this process imported, transformers say, follows them).
_VERSIONS = f"nemo_dist {package_version('nemo-dist')}  torch {torch.__version__}  python {platform.python_version()}"


def test_the_text_header_names_the_versions_its_verdicts_depend_on() -> None:
    assert format_report(FAILING).splitlines()[2].startswith(f"versions: {_VERSIONS}")


def test_the_command_writes_json_and_junit_of_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run of checks that need no process group, through ``main``: both files agree with its exit status."""
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["-q", "-k", "config.scope", "--json", str(json_path), "--junit-xml", str(junit_path)])
    document = json.loads(json_path.read_text())
    assert code == document["summary"]["exit_code"] == 0
    assert [v["check"] for v in document["verdicts"]] == [
        "config.scope_names_validated", "config.scope_normalised_to_tuple"]
    assert document["header"]["command"].startswith("nemo-dist-conformance")
    assert len(list(ET.parse(junit_path).getroot().iter("testcase"))) == len(document["verdicts"])
    assert "versions: nemo_dist" in capsys.readouterr().out


def test_version_prints_the_versions_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"nemo-dist-conformance {_VERSIONS}")


def test_list_checks_prints_what_a_run_would_make_filtered_by_component_and_runs_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list-checks", "--moe-fn", "nemo_dist.distributed.expert_parallel:parallelize_experts"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "4 checks"
    assert [line.split()[:3] for line in lines[:-1]] == [
        [name, "moe", "core"] for name in ("moe.forward_equals_one_process", "moe.gradients_equal_one_process",
                                           "moe.trains_like_one_process", "moe.experts_sharded_over_ep")]
    assert "Each rank's output and auxiliary load-balance loss equal one process's" in lines[0]


def test_help_groups_options_by_suite_and_names_every_suite(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    titles = ["what is checked: a preset of every component's modules:", "the gather suite:", "the ddp suite:",
              "the config suite:", "the fsdp2 suite:", "the tp suite:", "the a2a suite:", "the moe suite:",
              "the pp suite:", "how the run runs:"]
    assert [t for t in titles if t in text] == titles
    assert [text.index(t) for t in titles] == sorted(text.index(t) for t in titles)
    description = " ".join(text.split("options:")[0].split())
    for option in ("--gather", "--ddp", "--fsdp2", "--ddp-fn", "--tp", "--a2a", "--moe-fn", "--pp-fn"):
        assert f"({option}" in description or f" {option}" in description
