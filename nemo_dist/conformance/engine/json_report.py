"""The JSON report of a conformance run (``--json PATH``): the header and every verdict, for CI and bug reports.

The document (:data:`SCHEMA`, documented in ``docs/ci.md``)::

    {"schema": "nemo_dist.conformance/1",
     "header": {"components": {component: label}, "checked": [component],
                "backend": str, "tier": str, "max_examples": int | null, "seed": int | null,
                "strict": bool, "versions": {name: version}, "notes": [str], "command": str},
     "summary": {"exit_code": 0 | 1, "conforms": bool, "seconds": float, "counts": {outcome: int}},
     "verdicts": [{"check": str, "component": str, "tier": "core" | "extended", "world_size": int,
                   "outcome": "pass" | "fail" | "hang" | "not applicable" | "not supported" | "skipped",
                   "blocking": bool, "message": str, "likely_cause": str, "example": str,
                   "reproduce": str, "seconds": float, "findings": [{"message", "example", "likely_cause"}],
                   "warnings": [str]}]}

``world_size`` 0 is a check that needs no process group; ``reproduce`` is ""
for a verdict that needs none (a pass) or a run not started from a command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_dist.conformance.engine.report import header_labels, ordered_verdicts, reproduce_line, versions_of
from nemo_dist.conformance.engine.verdicts import Report, Verdict

__all__ = ["OUTCOMES", "SCHEMA", "report_json", "write_json"]

#: The schema's name and version: a change that removes or retypes a field bumps the number.
SCHEMA = "nemo_dist.conformance/1"
#: Every outcome a verdict may have, in the summary's order.
OUTCOMES = ("pass", "fail", "hang", "not applicable", "not supported", "skipped")


def _verdict(report: Report, v: Verdict, blocking: bool) -> dict[str, Any]:
    return {
        "check": v.check, "component": v.component, "tier": v.tier, "world_size": v.world_size,
        "outcome": v.outcome, "blocking": blocking, "message": v.message, "likely_cause": v.cause,
        "example": v.example, "reproduce": reproduce_line(report, v) if v.outcome != "pass" else "",
        "seconds": round(v.seconds, 3),
        "findings": [{"message": f.message, "example": f.example, "likely_cause": f.cause} for f in v.findings],
        "warnings": list(v.warnings),
    }


def report_json(report: Report, strict: bool = False) -> dict[str, Any]:
    """The JSON document of ``report`` (see the module docstring), judged as ``--strict`` does where ``strict``."""
    blocking = {id(v) for v in report.blocking(strict)}
    code = report.exit_code(strict)
    return {
        "schema": SCHEMA,
        "header": {
            "components": header_labels(report), "checked": list(report.components), "backend": report.backend,
            "tier": report.tier, "max_examples": report.max_examples, "seed": report.seed, "strict": strict,
            "versions": versions_of(report), "notes": list(report.notes), "command": report.command,
        },
        "summary": {"exit_code": code, "conforms": code == 0, "seconds": round(report.seconds, 3),
                    "counts": {outcome: report.count(outcome) for outcome in OUTCOMES}},  # type: ignore[arg-type]
        "verdicts": [_verdict(report, v, id(v) in blocking) for v in ordered_verdicts(report)],
    }


def write_json(report: Report, path: str | Path, strict: bool = False) -> None:
    """Write :func:`report_json` of ``report`` to ``path`` (UTF-8, indented)."""
    Path(path).write_text(json.dumps(report_json(report, strict), indent=2) + "\n", encoding="utf-8")
