"""How a ``--gather-fn`` callable is called, and the checks of that call made before any world starts.

Options give the values a call needs besides ``x``: ``--gather-kwarg
NAME=VALUE`` on every call, ``--gather-init NAME=VALUE`` to build a class
once per rank before calling the object (st-moe's ``AllGather(dim=0)``), and
``--gather-output INDEX``. A VALUE is a Python literal, or one of the
:data:`~nemo_dist.conformance.adapters.symbols.SYMBOLS` (``@out_buffers``,
``@row_sizes`` ...), which the rank fills for each call, since a fixed
literal cannot follow the call's input and group (:mod:`.symbols`).
:func:`check_call` reads the callable's signature (and its constructor's)
and turns a call that cannot work into an ``OptionError``. Errors name
options by field (``{opt:gather_kwarg}``), as
:class:`~nemo_dist.conformance.engine.errors.OptionError` words them per front end.
It imports only modules below it: :mod:`.signature`, :mod:`.symbols`,
:mod:`.errors` and :mod:`.implementation`.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from typing import Any

from nemo_dist.conformance.adapters import signature
from nemo_dist.conformance.adapters.signature import GROUP_PARAMETERS
from nemo_dist.conformance.adapters.symbols import FACTORY_TEXT, INIT_SYMBOLS, SYMBOLS, value_of
from nemo_dist.conformance.engine.errors import MissingParameter, OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable

__all__ = [
    "check_call",
    "missing_parameter_error",
    "parse_gather_init",
    "parse_gather_kwargs",
    "parse_gather_output",
    "parse_keyword_pairs",
    "parse_output_index",
]

_P = inspect.Parameter


def parse_keyword_pairs(items: Sequence[str], field: str, symbols: Sequence[str], example: str) -> dict[str, str]:
    """``NAME=VALUE`` texts of option ``field`` as ``{name: stored text}``: a literal's repr, ``@symbol`` or
    ``MODULE:NAME()``.

    ``symbols`` are the ``@names`` the option takes (none: every VALUE is a
    literal or a factory). ``MODULE:NAME()`` names a callable each rank calls
    once with no arguments; it is imported here to fail early. ``OptionError``
    for a malformed item, a name given twice, an unknown symbol, a factory
    that does not import or cannot be called, or a VALUE that is none of these.
    """
    either = " or an @symbol" if symbols else ""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name.isidentifier():
            raise OptionError(
                f"{{opt:{field}}} expects NAME=VALUE (VALUE a Python literal{either}), such as "
                f"{{opt:{field}}} {example}; got {item!r}"
            )
        if name in pairs:
            raise OptionError(f"{{opt:{field}}} names {name!r} twice; give each keyword once")
        if FACTORY_TEXT.fullmatch(text):
            try:
                resolve_callable(text[:-2], "mypackage.envs:make_environment", "a factory")
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}} {item!r}: {exc.template}") from None
            pairs[name] = text
            continue
        if symbols and text.startswith("@"):
            if text[1:] not in symbols:
                known = ", ".join(f"@{s}" for s in symbols)
                raise OptionError(f"{{opt:{field}}} {item!r}: {text!r} is no symbol; the symbols are {known}")
            pairs[name] = text
            continue
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise OptionError(
                f"{{opt:{field}}} {item!r}: {text!r} is not a Python literal (a number, string, "
                f"True/False/None, tuple, list or dict of them){', an @symbol' if symbols else ''} nor "
                f"MODULE:NAME() (a factory each rank calls); quote a string: {name}='text'"
            ) from None
        pairs[name] = repr(value)
    return pairs


def parse_gather_kwargs(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--gather-kwarg`` texts as ``(name, stored text)`` pairs: a literal (``ast.literal_eval``) or an @symbol.

    Raises ``OptionError`` for a malformed item, a value that is neither, a
    name given twice, or a name the checks pass themselves (``uneven``, and a
    process group by any value but ``@group``).
    """
    pairs = parse_keyword_pairs(items, "gather_kwarg", tuple(SYMBOLS), "dim=0")
    for name, text in pairs.items():
        if name == "uneven" or (name in GROUP_PARAMETERS and text != "@group"):
            raise OptionError(
                f"{{opt:gather_kwarg}} '{name}={text}': the checks pass {name}= themselves (uneven=True where "
                "a check needs it; a process group on every call: the subgroup a group check uses, else the "
                "whole world's); leave it out"
            )
    return tuple(pairs.items())


def parse_gather_init(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--gather-init`` texts as ``(name, stored text)`` pairs (a literal, or one of :data:`INIT_SYMBOLS`)."""
    return tuple(parse_keyword_pairs(items, "gather_init", INIT_SYMBOLS, "dim=0").items())


def parse_output_index(field: str, text: str | int | None, what: str) -> int | None:
    """An output index option (an int >= 0) of option ``field``, or None when not given.

    ``OptionError`` for anything else, saying it picks ``what`` out of a tuple or list return.
    """
    if text is None:
        return None
    try:
        index = int(str(text).strip())
    except ValueError:
        index = -1
    if index < 0:
        raise OptionError(
            f"{{opt:{field}}} expects the index (>= 0) of {what} in a tuple or list return, "
            f"such as {{opt:{field}}} 0; got {str(text)!r}"
        )
    return index


def parse_gather_output(text: str | int | None) -> int | None:
    """The ``--gather-output`` index (an int >= 0), or None when not given; ``OptionError`` for anything else."""
    return parse_output_index("gather_output", text, "the gathered tensor")


def check_call(field: str, spec: str, found: Any, impl: Implementation) -> None:
    """Raise ``OptionError`` when the signature of ``found`` (and its constructor's) rules out the checks' call.

    A class (not an autograd Function) is built once per rank with the
    ``--gather-init`` keywords, and the object is called: a required
    constructor parameter nobody gave is a ``MissingParameter``, a keyword it
    cannot take an ``OptionError``; ``--gather-init`` on anything else is one
    too. Then the call: a required parameter no ``--gather-kwarg`` fills is a
    ``MissingParameter``, a keyword the callable cannot take an
    ``OptionError``. A process group (a parameter the checks fill: the
    world's group when a check passes none) and ``uneven=`` are not asked for.
    """
    if signature.is_built_class(found):
        _check_constructor(field, spec, found, impl)
    elif impl.gather_init:
        kind = "an autograd Function, called through .apply" if signature.is_function_class(found) else (
            f"a {type(found).__name__}, called as it is"
        )
        raise OptionError(
            f"{{opt:gather_init}} applies to a class that is built, then called (such as an nn.Module); "
            f"{spec} is {kind}: leave {{opt:gather_init}} out"
        )
    parameters = signature.parameters_after_x(found)
    if parameters is None:
        return  # unreadable (a builtin): the first call in each world tells
    given = [name for name, _ in impl.gather_kwargs]
    _no_missing(field, spec, parameters, given, "gather_kwarg", "pass it on every call with")
    unknown = signature.not_taken(parameters, given, signature.is_function_class(found))
    if unknown:
        takes = ", ".join(p.name for p in parameters) or "nothing"
        raise OptionError(
            f"{{opt:gather_kwarg}} {unknown[0]}=...: {spec} takes no parameter {unknown[0]!r} (after x it takes: "
            f"{takes}); drop it or fix the name"
        )
    spread = [p.name for p in parameters if p.kind is _P.VAR_POSITIONAL and p.name in given]
    for name in spread:
        text = dict(impl.gather_kwargs)[name]
        if text.startswith("@") and text[1:] not in ("row_sizes", "out_buffers"):
            raise OptionError(
                f"{{opt:gather_kwarg}} {name}={text}: *{name} takes a list spread over positions; give a list or "
                "tuple, or @out_buffers or @row_sizes"
            )
        if not text.startswith("@") and not isinstance(value_of(text), (list, tuple)):
            raise OptionError(f"{{opt:gather_kwarg}} {name}={text}: *{name} takes a list or tuple to spread")


def _check_constructor(field: str, spec: str, found: type, impl: Implementation) -> None:
    """The ``--gather-init`` keywords against the constructor of class ``found``; ``OptionError`` if they fail."""
    if not signature.calls_instances(found):
        raise OptionError(f"{{opt:{field}}} {spec} is a class whose objects cannot be called on x (no __call__)")
    try:
        parameters = tuple(inspect.signature(found).parameters.values())
    except (TypeError, ValueError):
        return
    given = [name for name, _ in impl.gather_init]
    _no_missing(field, spec, parameters, given, "gather_init", "it is built once per rank: give it with", "class ")
    unknown = signature.not_taken(parameters, given, function_class=False)
    if unknown:
        takes = ", ".join(p.name for p in parameters) or "nothing"
        raise OptionError(
            f"{{opt:gather_init}} {unknown[0]}=...: the constructor of {spec} takes no parameter {unknown[0]!r} "
            f"(it takes: {takes}); drop it or fix the name"
        )


def _no_missing(
    field: str,
    spec: str,
    parameters: tuple[inspect.Parameter, ...],
    given: Sequence[str],
    option: str,
    remedy: str,
    what: str = "",
) -> None:
    """Raise ``MissingParameter`` for the required ``parameters`` neither ``given`` nor the checks fill."""
    missing = signature.unfilled(parameters, given, (*GROUP_PARAMETERS, "uneven"))
    if missing:
        owner = f"{what}{spec}" + ("'s constructor" if what else "")
        raise missing_parameter_error(
            f"{{opt:{field}}} {owner}", parameters, missing, option, remedy, f"such as {missing[0]}=0"
        )


def missing_parameter_error(
    subject: str,
    parameters: tuple[inspect.Parameter, ...],
    missing: Sequence[str],
    option: str,
    remedy: str,
    example: str = "",
) -> MissingParameter:
    """The usage error of a callable (``subject``, its option first) whose required ``missing`` parameters no
    option fills: it names them and the ``{opt:option} NAME=VALUE`` flags that would, after ``remedy``."""
    kinds = {p.name: p.kind for p in parameters}
    keyword = " keyword-only" if kinds[missing[0]] is _P.KEYWORD_ONLY else ""
    names = ", ".join(repr(n) for n in missing)
    flags = " ".join(f"{{opt:{option}}} {n}=VALUE" for n in missing)
    plural = "s" if len(missing) > 1 else ""
    return MissingParameter(
        f"{subject} has required{keyword} parameter{plural} {names} that no option fills; "
        f"{remedy} {flags} (VALUE a Python literal{', ' + example if example else ''})",
        missing[0],
    )
