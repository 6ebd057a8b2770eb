"""The parameters of a gather callable besides ``x``: which ones a call must fill, and how to pass them.

A function is called ``fn(x, ...)`` with keywords, except for its
positional-only parameters; a ``torch.autograd.Function`` subclass is called
through ``.apply``, which passes positional arguments only, so its values are
placed in ``forward``'s parameter order (:func:`arguments`); a value for a
``*args`` parameter is a list spread over the positions after the others.
Any other class is built first and the object called (an ``nn.Module``: its
``forward``). The front ends
use :func:`unfilled` and :func:`not_taken` to turn a call that cannot work into
a usage error before any world starts; :func:`missing_in` reads the same
mistake from the ``TypeError`` of a first call whose signature was hidden.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection, Mapping
from typing import Any

__all__ = [
    "GROUP_PARAMETERS",
    "arguments",
    "calls_instances",
    "is_built_class",
    "is_function_class",
    "missing_in",
    "missing_in_text",
    "not_taken",
    "parameters_after_x",
    "unfilled",
]

#: Parameter names taken to be a process group (the checks pass it, as they pass ``uneven=``).
GROUP_PARAMETERS: tuple[str, ...] = ("group", "process_group", "pg")

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_VARIADIC = (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)
# "f() missing 1 required keyword-only argument: 'dim'", "... 2 required positional arguments: 'a' and 'b'",
# and autograd's C++ apply: "forward() missing required argument: 'dim' (position 1)".
_MISSING = re.compile(r"missing (?:\d+ )?required (?:positional |keyword-only )?arguments?: (.+)$")


def is_function_class(found: Any) -> bool:
    """Whether ``found`` is a ``torch.autograd.Function`` subclass (called through ``.apply``)."""
    import torch

    return isinstance(found, type) and issubclass(found, torch.autograd.Function)


def is_built_class(found: Any) -> bool:
    """Whether ``found`` is a class built before it is called (any class but an autograd Function)."""
    return isinstance(found, type) and not is_function_class(found)


def calls_instances(cls: type) -> bool:
    """Whether objects of class ``cls`` can be called (it or a base other than ``object`` defines ``__call__``)."""
    return any("__call__" in vars(base) for base in cls.__mro__ if base is not object)


def parameters_after_x(found: Any) -> tuple[inspect.Parameter, ...] | None:
    """The parameters of ``found`` after ``x`` (after ``ctx, x`` for an autograd Function's ``forward``).

    A Function that defines ``setup_context`` has no ``ctx`` in ``forward``.
    A class built before the call: those of its objects' call (after ``self,
    x`` of ``forward`` for an ``nn.Module``, else of ``__call__``); an
    ``nn.Module`` object: those of its ``forward``. None when the signature
    cannot be read (a builtin, say).
    """
    import torch

    fn, skip = found, 1
    if is_function_class(found):
        fn = found.forward
        skip = 1 if found.setup_context is not torch.autograd.Function.setup_context else 2
    elif is_built_class(found):
        fn, skip = (found.forward if issubclass(found, torch.nn.Module) else found.__call__), 2
    elif isinstance(found, torch.nn.Module):
        fn = found.forward
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return tuple(parameters[skip:])


def unfilled(
    parameters: tuple[inspect.Parameter, ...], given: Collection[str], passed: Collection[str]
) -> tuple[str, ...]:
    """The required parameters (no default) that neither ``given`` names nor the checks pass (``passed``)."""
    return tuple(
        p.name
        for p in parameters
        if p.default is _P.empty and p.kind not in _VARIADIC and p.name not in given and p.name not in passed
    )


def not_taken(
    parameters: tuple[inspect.Parameter, ...], given: Collection[str], function_class: bool
) -> tuple[str, ...]:
    """The names of ``given`` the callable cannot receive (no such parameter, and no ``**kwargs`` to take it)."""
    names = {p.name for p in parameters if p.kind is not _P.VAR_KEYWORD}
    absorbs = not function_class and any(p.kind is _P.VAR_KEYWORD for p in parameters)
    return tuple(n for n in given if n not in names and not absorbs)


def arguments(
    parameters: tuple[inspect.Parameter, ...] | None, values: Mapping[str, Any], function_class: bool
) -> tuple[list[Any], dict[str, Any]]:
    """The positional arguments after ``x`` and the keywords that pass ``values`` (by parameter name).

    An autograd Function gets its values in ``forward``'s order, a parameter
    left before the last one given taking its default; a function gets
    keywords, except for positional-only parameters. A value for the
    ``*args`` parameter (a list) is spread after every positional parameter.
    With no readable signature, an autograd Function gets the values in
    their order. A parameter with no default left before a placed one is a
    ``TypeError`` naming it (never ``inspect.Parameter.empty`` passed on).
    """
    if parameters is None:
        return (list(values.values()), {}) if function_class else ([], dict(values))
    positional_names = [p.name for p in parameters if p.kind in _POSITIONAL]
    spread = next((p.name for p in parameters if p.kind is _P.VAR_POSITIONAL and p.name in values), None)
    by_position = [
        n for n in positional_names if n in values and (function_class or _kind(parameters, n) is _P.POSITIONAL_ONLY)
    ]
    last = len(positional_names) - 1 if spread else max((positional_names.index(n) for n in by_position), default=-1)
    placed = positional_names[: last + 1]
    args = [values.get(p.name, p.default) for p in parameters if p.name in placed]
    if any(a is _P.empty for a in args):
        name = next(n for n, a in zip(placed, args, strict=True) if a is _P.empty)
        raise TypeError(f"missing required argument: {name!r} (it comes before a value placed by position)")
    if spread is not None:
        args += list(values[spread])
    skipped = {*placed, spread}
    return args, {k: v for k, v in values.items() if k not in skipped}


def _kind(parameters: tuple[inspect.Parameter, ...], name: str) -> Any:
    return next(p.kind for p in parameters if p.name == name)


def missing_in(exc: BaseException) -> tuple[str, ...]:
    """The parameter names a "missing required argument" ``TypeError`` names (empty for any other exception)."""
    if not isinstance(exc, TypeError):
        return ()
    found = _MISSING.search(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    return tuple(re.findall(r"'(\w+)'", found.group(1))) if found else ()


def missing_in_text(text: str) -> tuple[str, ...]:
    """The parameters the first "TypeError: ... missing required argument" line of ``text`` names (a rank report)."""
    for line in text.splitlines():
        _, sep, message = line.partition("TypeError: ")
        names = missing_in(TypeError(message)) if sep else ()
        if names:
            return names
    return ()
