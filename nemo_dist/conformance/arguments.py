"""The command line's options: the parser, its defaults, and the parsing of option values.

:func:`parser` defines every option of ``nemo-dist-conformance``; the value
parsers (:func:`world_sizes`, :func:`seed`, :func:`timeout` ...) turn an
option's text into its value or raise :class:`UsageError` saying how to fix
it; :func:`reproduce_command` writes a run's options back as a command line.
The front end that uses them is :mod:`nemo_dist.conformance.cli`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from nemo_dist.conformance.deadlines import FLOOR_S
from nemo_dist.conformance.profile import NO_DATABASE, resolve_hypothesis_db
from nemo_dist.conformance.target import GATHER_FORMS, PRESETS
from nemo_dist.testing import options

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

#: World sizes when ``--world-sizes`` is not given (the reference run takes
#: well under 3 minutes with them on a 2-core machine; see conformance/README.md).
DEFAULT_WORLD_SIZES: tuple[int, ...] = (1, 2, 3, 4)
#: Hypothesis examples per check when ``--max-examples`` is not given.
DEFAULT_MAX_EXAMPLES = 10


class UsageError(Exception):
    """A bad command line; the message says what and how to fix it (exit 2)."""


def parser() -> argparse.ArgumentParser:
    """The argparse parser of ``nemo-dist-conformance``: every option, its default and help; values stay text."""
    p = argparse.ArgumentParser(
        prog="nemo-dist-conformance",
        description="Check that an implementation of the nemo_dist components (the bundled "
        "one, a fork named by module paths, any all-gather callable or any data-parallel wrapper) keeps the contract. "
        "Naming some of --gather/--gather-fn/--ddp/--config checks only those components (the "
        "bundled modules serve the others); --preset names all three; naming none checks the "
        "bundled nemo_dist modules.",
        epilog="Exit status: 0 conforms, 1 a check failed, 2 usage error. Under torchrun "
        "(torchrun --nproc-per-node N -m nemo_dist.conformance ...) the checks run in "
        "the torchrun world and rank 0 prints the table.",
    )
    p.add_argument("--gather", metavar="MODULE", help="module with all_gather_with_grad and all_gather_no_grad")
    p.add_argument(
        "--gather-fn",
        metavar="MODULE:NAME",
        help="one all-gather callable instead of a module: a function or a torch.autograd.Function "
        "subclass (called through .apply); its output is the concatenation on dim 0, a tuple of W "
        "tensors or a stacked [W, ...] tensor",
    )
    p.add_argument(
        "--no-grad-fn",
        metavar="MODULE:NAME",
        help="the no-grad counterpart of --gather-fn (default: --gather-fn under torch.no_grad())",
    )
    p.add_argument(
        "--gather-form",
        default="auto",
        help=f"output form of --gather-fn: {', '.join(GATHER_FORMS)} (default auto: detected from its first call)",
    )
    p.add_argument(
        "--gather-kwarg",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a keyword passed on every call of --gather-fn (and --no-grad-fn), VALUE a Python literal, such as "
        "--gather-kwarg dim=0, or a symbol filled per call: @out_buffers (W empty tensors like x), @row_sizes "
        "(every rank's rows), @world_size, @rank, @group; a *args name spreads a list; repeatable (group= and "
        "uneven= are the checks' to pass)",
    )
    p.add_argument(
        "--gather-init",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="--gather-fn names a class (an nn.Module, say) built once per rank with this keyword, then called: "
        "such as --gather-init dim=0; VALUE a Python literal or @group/@rank/@world_size; repeatable",
    )
    p.add_argument(
        "--gather-output",
        metavar="INDEX",
        help="--gather-fn returns a tuple or list holding the gathered value at INDEX, such as --gather-output 0 "
        "for a (gathered, sizes) return; --gather-form applies to that element",
    )
    p.add_argument("--ddp", metavar="MODULE", help="module with parallelize_ddp, DDPManager, or both (each is checked)")
    p.add_argument(
        "--ddp-fn",
        metavar="MODULE:NAME",
        help="any data-parallel wrapper instead of a ddp module, checked by behaviour: a function taking the model "
        "or a class constructed with it (the model goes to the first parameter no --ddp-kwarg names); its return "
        "is the wrapped model (None: changed in place)",
    )
    p.add_argument(
        "--ddp-method",
        metavar="NAME",
        help="--ddp-fn is a class constructed from the keywords whose method NAME takes the model, such as "
        "--ddp-method setup_module",
    )
    p.add_argument(
        "--ddp-kwarg",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a keyword passed on every call of --ddp-fn (its constructor with --ddp-method), VALUE a Python "
        "literal; repeatable (the DDP fields are the field checks' to pass)",
    )
    p.add_argument("--ddp-output", metavar="INDEX", help="--ddp-fn returns a tuple or list with the model at INDEX")
    p.add_argument(
        "--ddp-reduction", metavar="mean|sum", help="how the wrapper combines the ranks' gradients (default mean)"
    )
    p.add_argument(
        "--ddp-buffers",
        metavar="synced|local",
        help="what the wrapper does with module buffers (default: reported, not required)",
    )
    p.add_argument(
        "--ddp-after-backward",
        metavar="METHOD",
        help="a method of what --ddp-fn returned, called after each backward that syncs (finish_grad_sync)",
    )
    p.add_argument(
        "--ddp-grad-attr", metavar="NAME", help="the parameter attribute holding the reduced gradient (main_grad)"
    )
    p.add_argument(
        "--ddp-zero-grad",
        metavar="METHOD",
        help="a method of what --ddp-fn returned that clears the gradients each step (zero_grad_buffer)",
    )
    p.add_argument("--config", metavar="MODULE", help="module with DDPConfig")
    p.add_argument("--preset", metavar="NAME", help=f"named module layout: {', '.join(PRESETS)}")
    p.add_argument(
        "--world-sizes",
        metavar="SIZES",
        default=",".join(map(str, DEFAULT_WORLD_SIZES)),
        help="comma-separated world sizes (default %(default)s; ignored under torchrun)",
    )
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one GPU per rank); default gloo")
    p.add_argument("--tier", default="all", help="core, extended or all (default all)")
    p.add_argument(
        "--max-examples",
        metavar="N",
        default=str(DEFAULT_MAX_EXAMPLES),
        help="hypothesis examples per check (default %(default)s)",
    )
    p.add_argument("--strict", action="store_true", help="fail on any failing or unsupported check, not only core")
    p.add_argument("--junit-xml", metavar="PATH", help="also write a JUnit XML report to PATH")
    p.add_argument(
        "-k",
        "--select",
        metavar="TEXT",
        help="run only checks whose name contains TEXT ('not TEXT': all but those)",
    )
    p.add_argument(
        "--check",
        metavar="NAME",
        help="run only the check of this exact name (a ddp check's NAME[entry point] runs that entry point "
        "alone), as each failure's Reproduce line does",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        default="120",
        help="the most one step may take: its deadline is 10 x the slowest passing step so far, at least "
        "--min-deadline, and past it a step whose ranks are still working gets time up to this many seconds "
        "(default %(default)s)",
    )
    p.add_argument(
        "--min-deadline",
        metavar="SECONDS",
        default=str(FLOOR_S).removesuffix(".0"),
        help="the least per-step deadline (default %(default)s; at most --timeout). A step past its deadline "
        "is reported hung once every unfinished rank is blocked in a collective or a receive; while one is "
        "still working (importing, compiling, computing) it gets time up to --timeout",
    )
    p.add_argument(
        "--seed",
        metavar="N",
        help="hypothesis seed of every check (default: a fresh one, printed in the header and in each "
        "failure's Reproduce line, which runs that check alone with it)",
    )
    p.add_argument(
        "--hypothesis-db",
        metavar="DIR|none",
        help="where hypothesis keeps its example database (failing examples are replayed first on the next "
        "run) and its caches: DIR, or none for no database (caches in a temporary directory); default "
        "$XDG_CACHE_HOME/nemo_dist/hypothesis (else ~/.cache/nemo_dist/hypothesis), never the current directory",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no per-check progress on stderr")
    return p


#: Options a Reproduce line sets itself (or that do not change what a check does).
_NOT_REPEATED = ("select", "check", "world_sizes", "seed", "junit_xml", "quiet")


def reproduce_command(args: argparse.Namespace, program: str = "nemo-dist-conformance") -> str:
    """``program`` and the options of ``args`` but those a Reproduce line sets itself (check, sizes, seed, output).

    Options are written in their long form, only where they differ from the default.
    """
    parts = [program]
    for action in parser()._actions:
        if not action.option_strings or action.dest in _NOT_REPEATED or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        option = max(action.option_strings, key=len)
        if value is True:
            parts.append(option)
            continue
        for item in value if isinstance(value, list) else [value]:
            parts += [option, shlex.quote(str(item))]
    return " ".join(parts)


def option_name(field: str) -> str:
    """The command's option for an implementation field: ``gather_fn`` -> ``--gather-fn``."""
    return "--" + field.replace("_", "-")


def positive_int(option: str, text: str, example: str) -> int:
    """``text`` as an integer >= 1; else a :class:`UsageError` naming ``option`` with ``example`` as a fix."""
    try:
        return options.parse_positive_int(text)
    except options.BadOptionValue:
        raise UsageError(f"{option} expects an integer >= 1, such as {option} {example}; got {text!r}") from None


def world_sizes(text: str) -> tuple[int, ...]:
    """The sizes of ``--world-sizes`` (comma-separated integers >= 1); else a :class:`UsageError`."""
    try:
        return options.parse_world_sizes(text)
    except options.BadOptionValue as exc:
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
        return options.parse_seconds(text)
    except options.BadOptionValue:
        raise UsageError(f"--timeout expects a number of seconds > 0, such as --timeout 120; got {text!r}") from None


def min_deadline(text: str) -> float:
    """The ``--min-deadline`` seconds, a number > 0; else a :class:`UsageError`."""
    try:
        return options.parse_seconds(text)
    except options.BadOptionValue:
        raise UsageError(
            f"--min-deadline expects a number of seconds > 0, such as --min-deadline 30; got {text!r}"
        ) from None


def hypothesis_db(text: str | None) -> Path | None:
    """The directory ``--hypothesis-db`` gives (None: no database), created if missing; else a :class:`UsageError`.

    Not given (``text`` None): the default directory, as
    :func:`~nemo_dist.conformance.profile.resolve_hypothesis_db` decides.
    """
    try:
        return resolve_hypothesis_db(text)
    except ValueError as exc:
        raise UsageError(f"--hypothesis-db {exc}, such as --hypothesis-db {NO_DATABASE}") from None
