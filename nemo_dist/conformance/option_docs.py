"""The documentation's option tables, rendered from the option table's ``docs``.

A page marks each table it takes from the options with a pair of comments,
``<!-- options:NAME -->`` and ``<!-- /options:NAME -->``; :func:`render_readme`
rewrites what lies between them as :func:`render_table` gives it: one row per
:class:`~nemo_dist.conformance.option_spec.Doc` of table ``NAME``, in the
option table's order. ``scripts/render_option_tables.py`` writes the pages;
``tests/conformance/test_option_table.py`` fails when one differs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nemo_dist.conformance.option_spec import Option
from nemo_dist.conformance.options import OPTIONS
from nemo_dist.conformance.suites import suite_tables

__all__ = ["TABLES", "marked_tables", "render_readme", "render_table", "row_key"]

#: The README option tables by marker name: the header of their second column (a suite's own tables follow,
#: declared in its options module: :func:`~nemo_dist.conformance.suites.suite_tables`).
TABLES: Mapping[str, str] = {
    "names": "what it names",  # docs/conformance.md: what the options name to check
    "wrapper": "what it says",  # docs/wrappers.md: the --ddp-fn options
    **suite_tables(),
}

_BLOCK = re.compile(r"(<!-- options:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /options:(?P=name) -->)", re.S)


def row_key(option: Option) -> str:
    """The first cell of an option's row: its name and value as the README writes them, pipes escaped."""
    value = option.doc_value or option.metavar
    usage = option.name if value is None else f"{option.name} {value}"
    return "`" + usage.replace("|", "\\|") + "`"


def render_table(name: str) -> str:
    """The markdown of README table ``name`` (a key of :data:`TABLES`; ``KeyError`` otherwise), newline-ended."""
    lines = [f"| option | {TABLES[name]} |", "|---|---|"]
    for option in OPTIONS:
        lines += [f"| {row_key(option)} | {doc.text} |" for doc in option.docs if doc.table == name]
    return "\n".join(lines) + "\n"


def marked_tables(text: str) -> tuple[str, ...]:
    """The names of the option tables ``text`` marks, in order."""
    return tuple(match.group("name") for match in _BLOCK.finditer(text))


def render_readme(text: str) -> str:
    """``text`` with every marked option table rendered afresh; ``KeyError`` for a marker naming no table."""
    return _BLOCK.sub(lambda m: m.group(1) + render_table(m.group("name")) + m.group(4), text)
