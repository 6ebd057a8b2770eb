"""How one option of the conformance suite is declared, once for both front ends.

An :class:`Option` names the option as the command spells it (``--gather-fn``),
the front ends that declare it (the pytest plugin spells it
``--conformance-gather-fn``), its metavar, default, help, whether it is a flag
or repeatable, whether a Reproduce line repeats it, and the rows the README's
option tables give it (:class:`Doc`). Help texts name other options by field,
``{opt:gather_fn}``, as an ``OptionError`` does: :meth:`Option.help_in` words
them in a front end's spelling. The table of every option is
:data:`nemo_dist.conformance.engine.options.OPTIONS`.

Standard library only: the pytest plugin imports it when pytest loads it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMMAND",
    "FRONT_ENDS",
    "PYTEST",
    "PYTEST_PREFIX",
    "Doc",
    "Option",
    "PytestVariant",
    "command_name",
    "pytest_name",
]

#: The front end ``nemo-dist-conformance`` (argparse, :mod:`nemo_dist.conformance.frontends.arguments`).
COMMAND = "command"
#: The front end ``pytest conformance/`` (:mod:`nemo_dist.conformance.frontends.pytest_plugin`).
PYTEST = "pytest"
#: Both front ends, in the order the table's ``front_ends`` lists them.
FRONT_ENDS: tuple[str, ...] = (COMMAND, PYTEST)
#: What the pytest plugin puts before an option's bare name: ``--gather-fn`` -> ``--conformance-gather-fn``.
PYTEST_PREFIX = "--conformance-"

_FIELD = re.compile(r"\{opt:(\w+)\}")


def command_name(field: str) -> str:
    """The command's option for a field: ``gather_fn`` -> ``--gather-fn``."""
    return "--" + field.replace("_", "-")


def pytest_name(field: str) -> str:
    """The pytest plugin's option for a field: ``gather_fn`` -> ``--conformance-gather-fn``."""
    return PYTEST_PREFIX + field.replace("_", "-")


@dataclass(frozen=True)
class Doc:
    """One row a README option table gives an option: the table (its marker name) and the row's markdown text."""

    table: str
    text: str


@dataclass(frozen=True)
class PytestVariant:
    """How the pytest plugin declares an option it shares with the command, where it differs from the command.

    ``default`` replaces the command's (None: the engine decides, such as the
    hypothesis profile's example count); ``help`` the option's help when not
    None; ``type`` converts the value as pytest parses it (its error is pytest's).
    """

    default: str | None = None
    help: str | None = None
    type: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Option:
    """One option, declared once: what each front end makes of it is derived from these fields.

    ``name`` is the command's long spelling; ``short`` a short one the command
    also takes (``-k``). ``default`` is the command's default as text (values
    stay text in the command: its value parsers word the errors);
    ``flag`` options store True, ``repeatable`` ones collect a list
    (``action="append"``, default empty). ``choices`` lists the values the
    engine accepts, checked after parsing with each front end's own message
    (never by argparse). ``front_ends`` says who declares it; a command-only
    option may have a ``pytest_equivalent``, the option pytest or another
    plugin declares in its place (``--dist-timeout``). ``reproduce``: a
    Reproduce line repeats it when its value differs from the default.
    ``doc_value`` is what a README row writes after the name where the
    metavar would say less (an example its text speaks of); ``docs`` the rows.
    The rows' type column is derived from ``flag``, ``choices``, ``metavar``
    and ``repeatable``; ``kind`` words it where the metavar cannot (``RxS``:
    "two integers"). Their default column is ``default``, else
    ``doc_default``: markdown saying what applies when the option is not
    given where the engine decides it (``--ddp-reduce-dtype``: ``float32``).
    """

    name: str
    help: str
    metavar: str | None = None
    default: str | None = None
    flag: bool = False
    repeatable: bool = False
    short: str | None = None
    choices: tuple[str, ...] = ()
    front_ends: tuple[str, ...] = FRONT_ENDS
    pytest_equivalent: str | None = None
    pytest: PytestVariant | None = None
    reproduce: bool = True
    doc_value: str | None = None
    docs: tuple[Doc, ...] = ()
    kind: str | None = None
    doc_default: str | None = None

    def __post_init__(self) -> None:
        if not self.name.startswith("--") or self.name != self.name.lower():
            raise ValueError(f"option {self.name!r}: a name is a lower-case long option such as --gather-fn")
        if self.flag and self.repeatable:
            raise ValueError(f"option {self.name}: a flag cannot be repeatable")
        if not set(self.front_ends) <= set(FRONT_ENDS) or not self.front_ends:
            raise ValueError(f"option {self.name}: front_ends must name some of {', '.join(FRONT_ENDS)}")
        if PYTEST in self.front_ends and self.pytest_equivalent is not None:
            raise ValueError(f"option {self.name}: a pytest_equivalent is for an option pytest does not declare")
        if self.doc_default is not None and (self.default is not None or self.flag):
            raise ValueError(f"option {self.name}: a doc_default is for an option whose default the engine decides")

    @property
    def dest(self) -> str:
        """The field the option sets: ``--gather-fn`` -> ``gather_fn`` (argparse's attribute in the command)."""
        return self.name[2:].replace("-", "_")

    def spelling(self, front_end: str) -> str | None:
        """How ``front_end`` spells the option: its own name, else its equivalent there; None when it has none."""
        if front_end not in self.front_ends:
            return self.pytest_equivalent if front_end == PYTEST else None
        return command_name(self.dest) if front_end == COMMAND else pytest_name(self.dest)

    def default_in(self, front_end: str) -> Any:
        """The value ``front_end`` holds when the option is not given (a fresh list for a repeatable option)."""
        if self.flag:
            return False
        if self.repeatable:
            return []
        if front_end == PYTEST and self.pytest is not None:
            return self.pytest.default
        return self.default

    def help_in(self, front_end: str, table: Mapping[str, Option]) -> str:
        """The help text as ``front_end`` shows it: each ``{opt:FIELD}`` worded as ``table[FIELD]`` is spelled there.

        Raises ``ValueError`` when a named option has no spelling in ``front_end``.
        """
        text = self.pytest.help if front_end == PYTEST and self.pytest and self.pytest.help else self.help

        def word(match: re.Match[str]) -> str:
            spelled = table[match.group(1)].spelling(front_end)
            if spelled is None:
                raise ValueError(f"the help of {self.name} names {match.group(1)}, which {front_end} lacks")
            return spelled

        return _FIELD.sub(word, text)

    def declaration(self, front_end: str, table: Mapping[str, Option]) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The names and keywords ``front_end`` declares the option with: ``add_argument(*names, **keywords)``.

        ``argparse.ArgumentParser.add_argument`` and pytest's ``OptionGroup.addoption`` take the same ones.
        """
        spelled = self.spelling(front_end)
        if front_end not in self.front_ends or spelled is None:
            raise ValueError(f"{front_end} does not declare {self.name}")
        names = (self.short, spelled) if self.short and front_end == COMMAND else (spelled,)
        keywords: dict[str, Any] = {"help": self.help_in(front_end, table)}
        if self.flag:
            keywords["action"] = "store_true"
        elif self.repeatable:
            keywords["action"] = "append"
        if self.metavar is not None:
            keywords["metavar"] = self.metavar
        default = self.default_in(front_end)
        if default is not None and not self.flag:
            keywords["default"] = default
        if front_end == PYTEST and self.pytest is not None and self.pytest.type is not None:
            keywords["type"] = self.pytest.type
        return names, keywords

    def reproduce_words(self, front_end: str, value: Any) -> list[str]:
        """The words that repeat ``value`` on ``front_end``'s Reproduce line, shell-quoted.

        None for a value not given or equal to the default; the option alone for a set flag; the option and
        the value once per item of a repeatable option's list.
        """
        spelled = self.spelling(front_end)
        if value is None or value is False or value == self.default_in(front_end) or spelled is None:
            return []
        if value is True:
            return [spelled]
        items = value if isinstance(value, list) else [value]
        return [word for item in items for word in (spelled, shlex.quote(str(item)))]
