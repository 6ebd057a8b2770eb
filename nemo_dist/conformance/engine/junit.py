"""The JUnit XML file of a conformance run (``--junit-xml PATH``), agreeing with the run's exit status.

One ``testcase`` per check and world size. Only what blocks the run (the
exit status's :meth:`~nemo_dist.conformance.engine.verdicts.Report.blocking`) is a
``failure``, or an ``error`` for a HANG, so a conforming run's file shows no
red. A failure that does not block (an extended-tier finding outside
``--strict``) stays readable: its text is the testcase's ``system-out``.
Every testcase carries its outcome as a property, so not applicable, not
supported and skipped (all ``skipped`` elements, typed) can be told apart;
the suite's properties carry the versions, backend and tier.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from nemo_dist.conformance.engine.explain import Finding
from nemo_dist.conformance.engine.report import first_line, ordered_verdicts, reproduce_line, versions_of
from nemo_dist.conformance.engine.verdicts import Report, Verdict

__all__ = ["junit_xml", "write_junit_xml"]


def _details(report: Report, v: Verdict) -> str:
    """The finding's whole text: likely cause, example, message and traceback of each, then its Reproduce line."""
    found = v.findings or (Finding(v.message, v.example, v.cause, v.traceback),)
    parts = [first_line(v.message)] if v.findings else []
    for f in found:
        parts += [f"Likely cause: {f.cause}" if f.cause else "", f.example, f.message, f.traceback]
    reproduce = reproduce_line(report, v)
    return "\n".join(filter(None, [*parts, f"Reproduce: {reproduce}" if reproduce else ""]))


def _properties(parent: ET.Element, values: dict[str, str]) -> None:
    group = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(group, "property", name=name, value=value)


def junit_xml(report: Report, strict: bool = False) -> ET.ElementTree:
    """The JUnit XML tree of ``report`` as the module docstring lays it out (``strict``: as ``--strict`` judges)."""
    suite = ET.Element("testsuite", name="nemo_dist.conformance")
    _properties(suite, {**versions_of(report), "backend": report.backend, "tier": report.tier,
                        "strict": str(strict).lower(), "exit_code": str(report.exit_code(strict))})
    blocking = {id(v) for v in report.blocking(strict)}
    counts = {"failure": 0, "error": 0, "skipped": 0}
    for v in ordered_verdicts(report):
        case = ET.SubElement(suite, "testcase", classname=f"conformance.{v.component}.{v.tier}",
                             name=f"{v.check}[w{'-' if v.world_size == 0 else v.world_size}]", time=f"{v.seconds:.3f}")
        _properties(case, {"outcome": v.outcome, "blocking": str(id(v) in blocking).lower()})
        if id(v) in blocking:
            kind = "error" if v.outcome == "hang" else "failure"
            counts[kind] += 1
            element = ET.SubElement(case, kind, type=v.outcome, message=first_line(v.message) or v.outcome)
            element.text = _details(report, v)
        elif v.failed:  # a finding that does not block this run: readable, not red
            ET.SubElement(case, "system-out").text = (
                f"{v.outcome} ({v.tier} tier, does not block): {first_line(v.message)}\n{_details(report, v)}"
            )
        elif v.outcome in ("not applicable", "not supported", "skipped"):
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", type=v.outcome, message=f"{v.outcome}: {first_line(v.message)}")
    suite.set("tests", str(len(report.verdicts)))
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    suite.set("time", f"{report.seconds:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def write_junit_xml(report: Report, path: str | Path, strict: bool = False) -> None:
    """Write :func:`junit_xml` of ``report`` to ``path`` (UTF-8, with declaration)."""
    junit_xml(report, strict).write(path, encoding="utf-8", xml_declaration=True)
