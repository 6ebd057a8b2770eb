"""Render a conformance :class:`~nemo_dist.conformance._runner.Report`: text table and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from nemo_dist.conformance._runner import Report, Verdict

__all__ = ["format_progress", "format_report", "junit_xml", "write_junit_xml"]

#: Lines of each failure message shown under "Failures".
MESSAGE_LINES = 10

_LABELS = {
    "pass": "PASS",
    "fail": "FAIL",
    "not supported": "NOT SUPPORTED",
    "skipped": "SKIPPED",
}


def _label(v: Verdict, strict: bool) -> str:
    label = _LABELS[v.outcome]
    if v.outcome == "fail" and v.tier != "core" and not strict:
        return f"{label} (extended)"
    return label


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _ordered(report: Report) -> list[Verdict]:
    order: dict[str, int] = {}
    for v in report.verdicts:
        order.setdefault(v.check, len(order))
    return sorted(report.verdicts, key=lambda v: (order[v.check], v.world_size))


def format_progress(v: Verdict) -> str:
    """One line for a verdict as it arrives: ``w2 gather.forward ... PASS 0.31s``."""
    return f"w{v.world_size} {v.check} ... {_LABELS[v.outcome]} {v.seconds:.2f}s"


def format_report(report: Report, strict: bool = False) -> str:
    """The verdict table, the failures with their shrunk examples, and a summary line.

    Rows are one per check and world size (registration order, then size):
    check, world size, tier, verdict, time. Each failure lists its example and
    the first ``MESSAGE_LINES`` lines of its message; not-supported and
    skipped rows list their reason in one line.
    """
    impl = report.impl
    components = "  ".join(
        f"{name}={getattr(impl, name) or '-'}" + ("" if name in report.components else " (used, not checked)")
        for name in ("gather", "ddp", "config")
        if getattr(impl, name) is not None
    )
    examples = "profile" if report.max_examples is None else str(report.max_examples)
    lines = [
        f"nemo_dist conformance: {components}",
        f"backend={report.backend}  tier={report.tier}  max_examples={examples}"
        + ("  strict" if strict else ""),
    ]
    lines.extend(report.notes)
    lines.append("")
    rows = [("check", "world", "tier", "verdict", "time")]
    for v in _ordered(report):
        rows.append(
            (v.check, str(v.world_size), v.tier, _label(v, strict), f"{v.seconds:.2f}s")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for i, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row[:4], widths[:4], strict=True)]
        lines.append("  ".join([*cells, row[4].rjust(widths[4])]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    failures = [v for v in _ordered(report) if v.failed]
    if failures:
        lines += ["", "Failures", "========"]
        for v in failures:
            lines.append(f"--- {v.check} (world size {v.world_size}, {v.tier} tier) ---")
            if v.example:
                lines.extend(v.example.splitlines())
            message = v.message.strip().splitlines()
            lines.extend(message[:MESSAGE_LINES])
            if len(message) > MESSAGE_LINES:
                lines.append(f"... ({len(message) - MESSAGE_LINES} more lines)")
            lines.append("")
    reasons = [v for v in _ordered(report) if v.outcome == "not supported"]
    if reasons:
        lines += ["", "Not supported"]
        lines += [f"  {v.check} (w{v.world_size}): {_first_line(v.message)}" for v in reasons]
    code = report.exit_code(strict)
    summary = ", ".join(
        f"{report.count(outcome)} {word}"  # type: ignore[arg-type]
        for outcome, word in (
            ("pass", "passed"),
            ("fail", "failed"),
            ("not supported", "not supported"),
            ("skipped", "skipped"),
        )
    )
    lines += [
        "",
        f"{summary} in {report.seconds:.1f}s -> "
        + ("CONFORMS (exit 0)" if code == 0 else "DOES NOT CONFORM (exit 1)"),
    ]
    return "\n".join(lines) + "\n"


def junit_xml(report: Report, strict: bool = False) -> ET.ElementTree:
    """A JUnit XML tree: one ``testcase`` per check and world size.

    Failures get a ``failure`` element (message: first line, text: example and
    message); not-supported and skipped rows a ``skipped`` element, except
    that under ``strict`` not-supported is a failure. Extended-tier failures
    are failures too (CI shows them); the exit code decides what blocks.
    """
    suite = ET.Element("testsuite", name="nemo_dist.conformance")
    failures = skipped = 0
    for v in _ordered(report):
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"conformance.{v.component}.{v.tier}",
            name=f"{v.check}[w{v.world_size}]",
            time=f"{v.seconds:.3f}",
        )
        if v.failed or (strict and v.outcome == "not supported"):
            failures += 1
            element = ET.SubElement(case, "failure", message=_first_line(v.message))
            element.text = "\n".join(filter(None, [v.example, v.message]))
        elif v.outcome in ("not supported", "skipped"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{v.outcome}: {_first_line(v.message)}")
    suite.set("tests", str(len(report.verdicts)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suite.set("time", f"{report.seconds:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def write_junit_xml(report: Report, path: str | Path, strict: bool = False) -> None:
    """Write :func:`junit_xml` of ``report`` to ``path`` (UTF-8, with declaration)."""
    junit_xml(report, strict).write(path, encoding="utf-8", xml_declaration=True)
