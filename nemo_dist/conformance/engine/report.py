"""Render a conformance :class:`~nemo_dist.conformance.engine.verdicts.Report` as text: the header, the table, failures.

The header's pieces (:func:`header_labels`, :func:`versions_of`) and
:func:`reproduce_line` also serve the JUnit and JSON files
(:mod:`~nemo_dist.conformance.engine.junit`, :mod:`~nemo_dist.conformance.engine.json_report`).
"""

from __future__ import annotations

import shlex
from typing import Any

from nemo_dist.conformance.engine.explain import Finding
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.engine.target import COMPONENTS, STANDALONE, SUITE_TARGETS
from nemo_dist.conformance.engine.verdicts import Outcome, Report, Verdict
from nemo_dist.conformance.engine.versions import run_versions

__all__ = [
    "first_line",
    "format_progress",
    "format_report",
    "header_labels",
    "ordered_verdicts",
    "reproduce_line",
    "versions_of",
]

#: Lines of each failure message shown under "Failures" (the traceback of the code under test is shown whole).
MESSAGE_LINES = 10

_LABELS = {
    "pass": "PASS",
    "fail": "FAIL",
    "hang": "HANG",
    "not applicable": "NOT APPLICABLE",
    "not supported": "NOT SUPPORTED",
    "skipped": "SKIPPED",
}

#: Summary words per outcome, in the order the summary line lists them.
_SUMMARY: tuple[tuple[Outcome, str], ...] = (
    ("pass", "passed"),
    ("fail", "failed"),
    ("hang", "hung"),
    ("not applicable", "not applicable"),
    ("not supported", "not supported"),
    ("skipped", "skipped"),
)


def _label(v: Verdict, strict: bool) -> str:
    label = _LABELS[v.outcome]
    if v.failed and v.tier != "core" and not strict:
        return f"{label} (extended)"
    return label


def _reason_text(message: str) -> str:
    """The first line of a reason, without the exception name that carried it."""
    line = first_line(message)
    for prefix in ("NotApplicable: ", "ChosenByCode: ", "NotSupported: ", "SkipTest: "):
        line = line.removeprefix(prefix)
    return line


def _world(v: Verdict) -> str:
    return "-" if v.world_size == 0 else str(v.world_size)


def _where(v: Verdict) -> str:
    return "no process group" if v.world_size == 0 else f"world size {v.world_size}"


def _short(verdicts: list[Verdict]) -> str:
    """``check (w1, w2)`` for verdicts of one check (no sizes for a check without a world)."""
    sizes = ", ".join(f"w{v.world_size}" for v in verdicts if v.world_size)
    return f"{verdicts[0].check} ({sizes})" if sizes else verdicts[0].check


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` ("" for none)."""
    return text.strip().splitlines()[0] if text.strip() else ""


def ordered_verdicts(report: Report) -> list[Verdict]:
    """The report's verdicts grouped by check, in the order checks first ran, each check's by world size."""
    order: dict[str, int] = {}
    for v in report.verdicts:
        order.setdefault(v.check, len(order))
    return sorted(report.verdicts, key=lambda v: (order[v.check], v.world_size))


def format_progress(v: Verdict) -> str:
    """One line for a verdict as it arrives: ``w2 gather.forward ... PASS 0.31s`` (``w-`` without a world)."""
    return f"w{_world(v)} {v.check} ... {_LABELS[v.outcome]} {v.seconds:.2f}s"


def format_report(report: Report, strict: bool = False) -> str:
    """The verdict table, the failures with their shrunk examples, and a summary line.

    Rows are one per check run and world size (registration order, then
    size; "-" for a check that needs no process group): check, world size,
    tier, verdict, time. Each failure or hang lists its likely cause (when
    one was found), its example, the first ``MESSAGE_LINES`` lines of its
    message (a hang's in full) and the traceback of the code under test; each
    distinct failure so when hypothesis found several; then, when the report
    knows its command, the line that reproduces it alone. Not-applicable, not-supported and skipped rows list their
    reason in one line; warnings raised inside the checks are listed once each.
    """
    sections = [
        _header(report, strict),
        _table(report, strict),
        _failures(report),
        _reasons(report),
        _warnings(report),
        _summary(report, strict),
    ]
    return "\n".join(line for section in sections for line in section) + "\n"


def header_labels(report: Report) -> dict[str, str]:
    """What the run checked or used, by component (``gather`` -> its module or callable), in component order;
    a component only used, not checked, is labelled so."""
    impl = report.impl
    labels: dict[str, Any] = {}
    for component, target in SUITE_TARGETS.items():
        if target.label is not None:
            labels[component] = resolve_callable(target.label)(impl)
            continue
        labels[component] = next((_text(impl.value(f)) for f in target.label_fields if impl.value(f) is not None), None)
    return {
        name: str(labels[name]) + ("" if name in report.components else " (used, not checked)")
        for name in COMPONENTS
        if labels[name] not in (None, "-") and _shown(name, report.components)
    }


def versions_of(report: Report) -> dict[str, str]:
    """The versions the report's verdicts depend on (:func:`~nemo_dist.conformance.engine.versions.run_versions`),
    test targets included where the run names them."""
    return run_versions(" ".join([*header_labels(report).values(), *(str(v) for _, v in report.impl.suite_options)]))


def _header(report: Report, strict: bool) -> list[str]:
    """What was checked and how, the versions, then the run's notes and a blank line."""
    components = "  ".join(f"{name}={label}" for name, label in header_labels(report).items())
    examples = "profile" if report.max_examples is None else str(report.max_examples)
    seed = "" if report.seed is None else f"  seed={report.seed}"
    versions = "  ".join(f"{name} {version}" for name, version in versions_of(report).items())
    return [
        f"nemo_dist conformance: {components}",
        f"backend={report.backend}  tier={report.tier}  max_examples={examples}{seed}" + ("  strict" if strict else ""),
        f"versions: {versions}",
        *report.notes,
        "",
    ]


def _text(value: object) -> str:
    """A suite option's value as a header shows it: a repeatable one's texts joined by commas."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _shown(component: str, checked: tuple[str, ...]) -> bool:
    """Whether the header names ``component``: checked, or serving a checked one (a standalone one serves none)."""
    if component in checked:
        return True
    return component not in STANDALONE and any(c not in STANDALONE for c in checked)


def _table(report: Report, strict: bool) -> list[str]:
    """The verdict table: a header row, a rule, one row per verdict."""
    rows = [("check", "world", "tier", "verdict", "time")]
    for v in ordered_verdicts(report):
        rows.append((v.check, _world(v), v.tier, _label(v, strict), f"{v.seconds:.2f}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row[:4], widths[:4], strict=True)]
        lines.append("  ".join([*cells, row[4].rjust(widths[4])]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def reproduce_line(report: Report, v: Verdict) -> str:
    """The command that runs ``v``'s check alone, in its world size, with the run's seed ("" without a command).

    Under torchrun (unseeded: derandomized, the same examples on every run)
    the world is the launcher's, so the line names no world size or seed.
    """
    if not report.command:
        return ""
    parts = [report.command, "--check", shlex.quote(v.check)]
    if v.world_size and not report.command_sets_world:
        parts += ["--world-sizes", str(v.world_size)]
    if report.seed is not None:
        parts += ["--seed", str(report.seed)]
    return " ".join(parts)


def _finding_lines(f: Finding, whole: bool) -> list[str]:
    """A finding's likely cause, example, message (cut at ``MESSAGE_LINES`` unless ``whole``) and traceback."""
    lines = [f"Likely cause: {f.cause}"] if f.cause else []
    lines += f.example.splitlines()
    message = f.message.strip().splitlines()
    shown = len(message) if whole else MESSAGE_LINES
    lines += message[:shown]
    if len(message) > shown:
        lines.append(f"... ({len(message) - shown} more lines)")
    return lines + f.traceback.strip().splitlines()


def _failures(report: Report) -> list[str]:
    """Each failure or hang: where, its likely cause, example, message and traceback, and how to reproduce it."""
    failures = [v for v in ordered_verdicts(report) if v.failed]
    if not failures:
        return []
    lines = ["", "Failures", "========"]
    for v in failures:
        lines.append(f"--- {v.check} ({_where(v)}, {v.tier} tier{', HANG' if v.outcome == 'hang' else ''}) ---")
        if v.findings:
            lines.append(first_line(v.message))
            for i, found in enumerate(v.findings, 1):
                lines.append(f"[{i} of {len(v.findings)}]")
                lines += _finding_lines(found, whole=False)
        else:
            lines += _finding_lines(Finding(v.message, v.example, v.cause, v.traceback), whole=v.outcome == "hang")
        reproduce = reproduce_line(report, v)
        if reproduce:
            lines.append(f"Reproduce: {reproduce}")
        lines.append("")
    return lines


def _reasons(report: Report) -> list[str]:
    """The not-applicable, not-supported and skipped checks, one line per check and reason."""
    lines: list[str] = []
    for outcome, title in (("not applicable", "Not applicable"), ("not supported", "Not supported"),
                           ("skipped", "Skipped")):
        reasons: dict[tuple[str, str], list[Verdict]] = {}
        for v in ordered_verdicts(report):
            if v.outcome == outcome:
                chosen = " (the code's own choice: blocks --strict)" if v.chosen else ""
                reasons.setdefault((v.check, _reason_text(v.message) + chosen), []).append(v)
        if reasons:
            lines += ["", title]
            lines += [f"  {_short(same)}: {reason}" for (_, reason), same in reasons.items()]
    return lines


def _warnings(report: Report) -> list[str]:
    """Each distinct warning raised inside the checks, once, with where it was first raised."""
    raised = report.warnings()
    if not raised:
        return []
    lines = ["", "Warnings raised inside the checks (notes, not failures)"]
    for text, where in raised.items():
        more = f" and {len(where) - 1} more" if len(where) > 1 else ""
        lines.append(f"  {first_line(text)} [{where[0]}{more}]")
    return lines


def _summary(report: Report, strict: bool) -> list[str]:
    """A blank line, then the counts of each outcome, the time and the verdict of the run."""
    code = report.exit_code(strict)
    extended = sum(v.outcome == "fail" and v.tier != "core" for v in report.verdicts)
    parts = []
    for outcome, word in _SUMMARY:
        n = report.count(outcome)
        if outcome == "fail" and extended:
            word += f" ({extended} extended)"
        if n or outcome in ("pass", "fail"):
            parts.append(f"{n} {word}")
    verdict = "CONFORMS (exit 0)" if code == 0 else "DOES NOT CONFORM (exit 1)"
    return ["", f"{', '.join(parts)} in {report.seconds:.1f}s -> {verdict}"]
