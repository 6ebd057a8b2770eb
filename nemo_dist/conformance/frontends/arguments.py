"""The command line's options: the parser, its defaults, and the parsing of option values.

:func:`parser` declares the options of ``nemo-dist-conformance`` from the
table both front ends read (:data:`nemo_dist.conformance.engine.options.OPTIONS`,
where their defaults and help are); the value
parsers (:func:`world_sizes`, :func:`seed`, :func:`timeout` ...) turn an
option's text into its value or raise :class:`UsageError` saying how to fix
it; :func:`reproduce_command` writes a run's options back as a command line.
The front end that uses them is :mod:`nemo_dist.conformance.frontends.cli`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_dist.conformance.engine import options
from nemo_dist.conformance.engine.option_spec import command_name
from nemo_dist.conformance.engine.options import DEFAULT_MAX_EXAMPLES, DEFAULT_WORLD_SIZES
from nemo_dist.conformance.engine.profile import NO_DATABASE, resolve_hypothesis_db
from nemo_dist.testing import options as values

__all__ = [
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_WORLD_SIZES",
    "UsageError",
    "hypothesis_db",
    "min_deadline",
    "option_name",
    "parser",
    "positive_int",
    "reproduce_command",
    "seed",
    "timeout",
    "world_sizes",
]


class UsageError(Exception):
    """A bad command line; the message says what and how to fix it (exit 2)."""


_DESCRIPTION = (
    "Check, by behaviour against one process, that distributed training code keeps its contract: an all-gather "
    "(--gather, --gather-fn), DDP (--ddp), its config (--config), FSDP2 (--fsdp2), any data-parallel wrapper "
    "(--ddp-fn), a tensor-parallel plan (--tp, --tp-plan), an autograd all-to-all (--a2a, --a2a-fn), "
    "expert parallelism (--moe-fn) and a pipeline (--pp-fn). Naming some checks only those components (the "
    "bundled modules serve the others); --preset names them all; naming none checks the bundled nemo_dist modules."
)
_EPILOG = (
    "Exit status: 0 conforms, 1 a check failed, 2 usage error. Under torchrun (torchrun --nproc-per-node N -m "
    "nemo_dist.conformance ...) the checks run in the torchrun world and rank 0 prints the table."
)


def parser() -> argparse.ArgumentParser:
    """The argparse parser of ``nemo-dist-conformance``: the table's command options, their defaults and help.

    Values stay text: the value parsers below turn them into values and word their errors.
    """
    p = argparse.ArgumentParser(prog="nemo-dist-conformance", description=_DESCRIPTION, epilog=_EPILOG)
    for title, group in options.sections(options.COMMAND):
        section = p.add_argument_group(title)
        for entry in group:
            names, keywords = entry.declaration(options.COMMAND, options.BY_FIELD)
            section.add_argument(*names, **keywords)
    return p


def reproduce_command(args: argparse.Namespace, program: str = "nemo-dist-conformance") -> str:
    """``program`` and the options of ``args`` a Reproduce line repeats (the table's ``reproduce``), in table order.

    Options are written in their long form, only where they differ from the default; those a Reproduce line
    sets itself (check, sizes, seed) or that do not change what a check does (output) are left out.
    """
    parts = [program]
    for entry in options.repeated(options.COMMAND):
        parts += entry.reproduce_words(options.COMMAND, getattr(args, entry.dest, None))
    return " ".join(parts)


def option_name(field: str) -> str:
    """The command's option for an implementation field: ``gather_fn`` -> ``--gather-fn``."""
    return command_name(field)


def positive_int(option: str, text: str, example: str) -> int:
    """``text`` as an integer >= 1; else a :class:`UsageError` naming ``option`` with ``example`` as a fix."""
    try:
        return values.parse_positive_int(text)
    except values.BadOptionValue:
        raise UsageError(f"{option} expects an integer >= 1, such as {option} {example}; got {text!r}") from None


def world_sizes(text: str) -> tuple[int, ...]:
    """The sizes of ``--world-sizes`` (comma-separated integers >= 1); else a :class:`UsageError`."""
    try:
        return values.parse_world_sizes(text)
    except values.BadOptionValue as exc:
        got = exc.value.strip()
        raise UsageError(f"--world-sizes expects an integer >= 1, such as --world-sizes 2,3; got {got!r}") from None


def seed(text: str | None) -> int | None:
    """The ``--seed`` value, an integer >= 0, or None when not given; else a :class:`UsageError`."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"--seed expects an integer >= 0, such as --seed 1234; got {text!r}")
    return value


def timeout(text: str) -> float:
    """The ``--timeout`` seconds, a number > 0; else a :class:`UsageError`."""
    try:
        return values.parse_seconds(text)
    except values.BadOptionValue:
        raise UsageError(f"--timeout expects a number of seconds > 0, such as --timeout 120; got {text!r}") from None


def min_deadline(text: str) -> float:
    """The ``--min-deadline`` seconds, a number > 0; else a :class:`UsageError`."""
    try:
        return values.parse_seconds(text)
    except values.BadOptionValue:
        raise UsageError(
            f"--min-deadline expects a number of seconds > 0, such as --min-deadline 30; got {text!r}"
        ) from None


def hypothesis_db(text: str | None) -> Path | None:
    """The directory ``--hypothesis-db`` gives (None: no database), created if missing; else a :class:`UsageError`.

    Not given (``text`` None): the default directory, as
    :func:`~nemo_dist.conformance.engine.profile.resolve_hypothesis_db` decides.
    """
    try:
        return resolve_hypothesis_db(text)
    except ValueError as exc:
        raise UsageError(f"--hypothesis-db {exc}, such as --hypothesis-db {NO_DATABASE}") from None
