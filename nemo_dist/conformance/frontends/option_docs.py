"""The documentation's option tables, rendered from the option table's ``docs``.

A page marks each table it takes from the options with a pair of comments,
``<!-- options:NAME -->`` and ``<!-- /options:NAME -->``; :func:`render_readme`
rewrites what lies between them as :func:`render_table` gives it: one row per
:class:`~nemo_dist.conformance.engine.option_spec.Doc` of table ``NAME``, in the
option table's order, with the option's type (:func:`type_cell`) and default
(:func:`default_cell`) derived from its declaration, as ruff's settings pages
give them. ``scripts/render_option_tables.py`` writes the pages;
``tests/conformance/test_option_table.py`` fails when one differs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nemo_dist.conformance.engine.declarations import suite_tables
from nemo_dist.conformance.engine.option_spec import Option
from nemo_dist.conformance.engine.options import OPTIONS

__all__ = ["KINDS", "TABLES", "default_cell", "marked_tables", "render_readme", "render_table", "row_key", "type_cell"]

#: The README option tables by marker name: the header of their second column (a suite's own tables follow,
#: declared in its options module: :func:`~nemo_dist.conformance.engine.declarations.suite_tables`).
TABLES: Mapping[str, str] = {
    "names": "what it names",  # docs/conformance.md: what the options name to check
    **suite_tables(),
}

#: What a value of each metavar is, as the type column words it (an option's ``kind`` words one not here; a
#: metavar neither knows is shown as it is, in code).
KINDS: Mapping[str, str] = {
    "MODULE": "module",
    "MODULE:NAME": "importable object",
    "NAME=VALUE": "keyword",
    "INDEX": "integer >= 0",
    "N": "integer",
    "SECONDS": "seconds",
    "PATH": "path",
    "NAME": "name",
    "METHOD": "method name",
    "TEXT": "text",
    "SIZES": "integers, comma-separated",
}

_BLOCK = re.compile(r"(<!-- options:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /options:(?P=name) -->)", re.S)


def _cell(text: str) -> str:
    """``text`` fit for a table cell: every pipe not yet escaped escaped."""
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def row_key(option: Option) -> str:
    """The first cell of an option's row: its name and value as the README writes them, pipes escaped.

    The value is ``doc_value``, else the metavar, except for an option with ``choices`` (its type cell lists them).
    """
    value = option.doc_value or (None if option.choices else option.metavar)
    usage = option.name if value is None else f"{option.name} {value}"
    return _cell(f"`{usage}`")


def type_cell(option: Option) -> str:
    """The type cell of an option's row: ``flag``, its choices (`` `mean` \\| `sum` ``), else its ``kind`` or what
    :data:`KINDS` says of its metavar (the metavar in code where it says nothing), ``, repeatable`` for a
    repeatable option; pipes escaped."""
    if option.flag:
        kind = "flag"
    elif option.choices:
        kind = " | ".join(f"`{choice}`" for choice in option.choices)
    elif option.kind is not None:
        kind = option.kind
    elif option.metavar is None:
        kind = "text"
    else:
        kind = KINDS.get(option.metavar, f"`{option.metavar}`")
    return _cell(kind + (", repeatable" if option.repeatable else ""))


def default_cell(option: Option) -> str:
    """The default cell of an option's row: its ``default`` in code, else its ``doc_default``; ``off`` for a flag,
    ``-`` for an option unset when not given; pipes escaped."""
    if option.flag:
        return "off"
    if option.default is not None:
        return _cell(f"`{option.default}`")
    return _cell(option.doc_default) if option.doc_default is not None else "-"


def render_table(name: str) -> str:
    """The markdown of README table ``name`` (a key of :data:`TABLES`; ``KeyError`` otherwise), newline-ended.

    Its columns: the option, its type, its default, and the table's own (``what it says``).
    """
    lines = [f"| option | type | default | {TABLES[name]} |", "|---|---|---|---|"]
    for option in OPTIONS:
        cells = (row_key(option), type_cell(option), default_cell(option))
        lines += [f"| {' | '.join(cells)} | {_cell(doc.text)} |" for doc in option.docs if doc.table == name]
    return "\n".join(lines) + "\n"


def marked_tables(text: str) -> tuple[str, ...]:
    """The names of the option tables ``text`` marks, in order."""
    return tuple(match.group("name") for match in _BLOCK.finditer(text))


def render_readme(text: str) -> str:
    """``text`` with every marked option table rendered afresh; ``KeyError`` for a marker naming no table."""
    return _BLOCK.sub(lambda m: m.group(1) + render_table(m.group("name")) + m.group(4), text)
