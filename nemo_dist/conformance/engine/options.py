"""Every option of the conformance suite, declared once: :data:`OPTIONS`, read by both front ends.

The command's argparse parser (:func:`nemo_dist.conformance.frontends.arguments.parser`)
and the pytest plugin's ``pytest_addoption`` are built from this table
(:func:`declared`), both Reproduce lines repeat the options it marks
(:func:`repeated`), and the README's option tables are rendered from its
``docs`` (:mod:`nemo_dist.conformance.frontends.option_docs`). How one entry is read is
:class:`~nemo_dist.conformance.engine.option_spec.Option`'s docstring. The order is
the command's ``--help`` order and the order a Reproduce line writes options in.

Values of ``choices`` and defaults repeat engine constants that import torch
(``TIERS``, ``PRESETS``, ``FLOOR_S``; a suite's own, such as ``GATHER_FORMS``): this module stays
importable without it, and ``tests/conformance/test_option_table.py`` pins them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_dist.conformance.engine.declarations import suite_option_modules, suite_options
from nemo_dist.conformance.engine.option_spec import COMMAND, PYTEST, Doc, Option, PytestVariant

__all__ = [
    "BY_FIELD",
    "COMMAND",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_MIN_DEADLINE",
    "DEFAULT_WORLD_SIZES",
    "OPTIONS",
    "PYTEST",
    "declarations",
    "declared",
    "option",
    "repeated",
    "sections",
    "spelling",
]

#: World sizes when ``--world-sizes`` is not given (every check's range on a CPU machine; the reference
#: run's time with them: benchmarks/results/).
DEFAULT_WORLD_SIZES: tuple[int, ...] = (1, 2, 3, 4)
#: Hypothesis examples per check when the command's ``--max-examples`` is not given.
DEFAULT_MAX_EXAMPLES = 10
#: The command's ``--min-deadline`` when not given: the deadlines' floor, ``FLOOR_S`` seconds.
DEFAULT_MIN_DEADLINE = "10"

_NAMES = "names"  # the README table "| option | what it names |"
_COMMAND_ONLY = (COMMAND,)

#: What is checked, across every suite: a named layout of every component's modules.
_TARGET_OPTIONS: tuple[Option, ...] = (
    Option(
        "--preset", metavar="NAME", choices=("nemo_dist", "nemo_automodel"),
        help="named module layout: nemo_dist, nemo_automodel", doc_value="nemo_automodel",
        docs=(Doc(_NAMES, "every component, at upstream's module paths (install it with `pip install --no-deps "
                          "nemo-automodel==0.7.0`)"),),
    ),
)

#: How a run runs.
_RUN_OPTIONS: tuple[Option, ...] = (
    Option(
        "--world-sizes", metavar="SIZES", default=",".join(map(str, DEFAULT_WORLD_SIZES)),
        help="comma-separated world sizes (default %(default)s; ignored under torchrun)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--dist-world-sizes", reproduce=False,
    ),
    Option(
        "--backend", default="gloo", choices=("gloo", "nccl"),
        help="gloo (CPU) or nccl (one GPU per rank); default gloo",
    ),
    Option("--tier", default="all", choices=("core", "extended", "all"), help="core, extended or all (default all)"),
    Option(
        "--max-examples", metavar="N", default=str(DEFAULT_MAX_EXAMPLES),
        help="hypothesis examples per check (default %(default)s)",
        pytest=PytestVariant(type=int, help="hypothesis examples per check (default: the active hypothesis profile's)"),
    ),
    Option(
        "--strict", flag=True,
        help="fail on any failing or unsupported check, not only core, and on a check not applicable because of "
        "what the code under test chose (no DDP object to inspect, a comm hook of its own)",
        front_ends=_COMMAND_ONLY
    ),
    Option(
        "--junit-xml", metavar="PATH", help="also write a JUnit XML report to PATH",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--junit-xml", reproduce=False,
    ),
    Option(
        "--json", metavar="PATH",
        help="also write every verdict and the header (versions included) as JSON to PATH (schema: docs/ci.md)",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--list-checks", flag=True,
        help="print the checks the run would make (name, component, tier, promise) and exit, running none",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--version", flag=True, help="print the versions of nemo_dist, torch and Python and exit",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--select", short="-k", metavar="TEXT",
        help="run only checks whose name contains TEXT ('not TEXT': all but those)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="-k", reproduce=False,
    ),
    Option(
        "--check", metavar="NAME",
        help="run only the check of this exact name (a ddp check's NAME[entry point] runs that entry point alone), "
        "as each failure's Reproduce line does",
        front_ends=_COMMAND_ONLY, reproduce=False,  # under pytest, a node id names the test
    ),
    Option(
        "--timeout", metavar="SECONDS", default="120",
        help="the most one step may take: its deadline is 10 x the slowest passing step so far, at least "
        "{opt:min_deadline}, and past it a step whose ranks are still working gets time up to this many seconds "
        "(default %(default)s)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--dist-timeout",
    ),
    Option(
        "--min-deadline", metavar="SECONDS", default=DEFAULT_MIN_DEADLINE,
        help=f"the least per-step deadline (default {DEFAULT_MIN_DEADLINE}; at most {{opt:timeout}}). A step past its "
        "deadline is reported hung once every unfinished rank is blocked in a collective or a receive; while one is "
        "still working (importing, compiling, computing) it gets time up to {opt:timeout}",
        pytest=PytestVariant(),  # not given: the plugin's min_deadline() applies the floor
    ),
    Option(
        "--seed", metavar="N",
        help="hypothesis seed of every check (default: a fresh one, printed in the header and in each failure's "
        "Reproduce line, which runs that check alone with it)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--hypothesis-seed", reproduce=False,
    ),
    Option(
        "--hypothesis-db", metavar="DIR|none",
        help="where hypothesis keeps its example database (failing examples are replayed first on the next run) and "
        "its caches: DIR, or none for no database (caches in a temporary directory); default "
        "$XDG_CACHE_HOME/nemo_dist/hypothesis (else ~/.cache/nemo_dist/hypothesis), never the current directory",
        kind="directory or `none`",
    ),
    Option(
        "--quiet", short="-q", flag=True, help="no per-check progress on stderr",
        front_ends=_COMMAND_ONLY, pytest_equivalent="-q", reproduce=False,
    ),
)

#: Every option: what is checked (the engine's components, then each suite's own options, declared in its
#: ``options`` module: :mod:`nemo_dist.conformance.engine.declarations`), then how the run runs.
OPTIONS: tuple[Option, ...] = (*_TARGET_OPTIONS, *suite_options(), *_RUN_OPTIONS)

#: The options by field (``gather_fn``), as help texts and ``{opt:FIELD}`` name them.
BY_FIELD: Mapping[str, Option] = {o.dest: o for o in OPTIONS}


def option(field: str) -> Option:
    """The option that sets ``field`` (``"gather_fn"``); ``KeyError`` for a field no option sets."""
    return BY_FIELD[field]


def spelling(field: str, front_end: str) -> str:
    """How ``front_end`` spells the option of ``field``: its own, or the option declared in its place there.

    Raises ``LookupError`` for a field no option sets or one ``front_end`` has no spelling for.
    """
    spelled = option(field).spelling(front_end)
    if spelled is None:
        raise LookupError(f"{front_end} has no option for {field}")
    return spelled


def declared(front_end: str) -> tuple[Option, ...]:
    """The options ``front_end`` declares (``COMMAND`` or ``PYTEST``), in table order."""
    return tuple(o for o in OPTIONS if front_end in o.front_ends)


def declarations(front_end: str) -> tuple[tuple[tuple[str, ...], dict[str, Any]], ...]:
    """The ``(names, keywords)`` each option of ``front_end`` is declared with, in table order.

    Passed as ``add_argument(*names, **keywords)`` to argparse; pytest's ``OptionGroup.addoption`` takes the same.
    """
    return tuple(o.declaration(front_end, BY_FIELD) for o in declared(front_end))


def sections(front_end: str) -> tuple[tuple[str, tuple[Option, ...]], ...]:
    """The options ``front_end`` declares, grouped as ``--help`` lists them: the preset, then each suite's own
    options under its component's name, then how the run runs."""
    mine = set(declared(front_end))
    groups: list[tuple[str, tuple[Option, ...]]] = [
        ("what is checked: a preset of every component's modules", _TARGET_OPTIONS)
    ]
    for module in suite_option_modules():
        target = getattr(module, "TARGET", None)
        name = target.component if target is not None else module.__name__.split(".")[-2]
        groups.append((f"the {name} suite", tuple(getattr(module, "OPTIONS", ()))))
    groups.append(("how the run runs", _RUN_OPTIONS))
    return tuple((title, found) for title, group in groups if (found := tuple(o for o in group if o in mine)))


def repeated(front_end: str) -> tuple[Option, ...]:
    """The options ``front_end``'s Reproduce line repeats (when their value differs from the default)."""
    return tuple(o for o in declared(front_end) if o.reproduce)


def _check_table() -> None:
    """Fields are unique and every help text words in each front end declaring it (fails at import, not at --help)."""
    if len(BY_FIELD) != len(OPTIONS):
        raise ValueError("two options set the same field")
    for entry in OPTIONS:
        for front_end in entry.front_ends:
            entry.help_in(front_end, BY_FIELD)


_check_table()
