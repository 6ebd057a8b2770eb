"""The gather component's fields: how its options become them, how reports name it, and their validation.

The gather suite declares these as its hooks (:mod:`nemo_dist.conformance.suites.gather.options`): a module
(``gather``) or one callable (``gather_fn``, with ``no_grad_fn``, ``gather_form``, ``gather_kwargs``,
``gather_output`` and ``gather_init`` saying how to call it, :mod:`.callables`). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.adapters.callables import (
    check_call,
    parse_gather_init,
    parse_gather_kwargs,
    parse_gather_output,
)
from nemo_dist.conformance.adapters.symbols import value_of
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable

__all__ = ["GATHER_FORMS", "call_kwargs", "gather_label", "init_kwargs", "resolve_gather", "validate_gather"]

#: Output forms of a ``--gather-fn`` callable ("auto": detected from each call's result).
GATHER_FORMS: tuple[str, ...] = ("auto", "cat", "tuple", "stacked")


def resolve_gather(given: dict[str, Any]) -> dict[str, Any]:
    """The fields the gather options hold (``given``: the options given, by field).

    ``gather_kwarg`` (or ``gather_kwargs``) and ``gather_init`` are ``NAME=VALUE`` texts, ``gather_output`` an
    index: parsed here. A callable replaces the module (``gather`` holds None). Raises ``OptionError`` for a
    bad combination or value.
    """
    gather, gather_fn = given.get("gather"), given.get("gather_fn")
    form = given.get("gather_form", "auto")
    if form not in GATHER_FORMS:
        raise OptionError(f"{{opt:gather_form}} expects one of {', '.join(GATHER_FORMS)}; got {form!r}")
    if gather_fn is not None and gather is not None:
        raise OptionError("{opt:gather} names a module and {opt:gather_fn} a callable; give one of them")
    if given.get("no_grad_fn") is not None and gather_fn is None:
        raise OptionError(
            "{opt:no_grad_fn} goes with {opt:gather_fn} (a module's all_gather_no_grad is found by {opt:gather})"
        )
    if form != "auto" and gather_fn is None:
        raise OptionError("{opt:gather_form} applies to a {opt:gather_fn} callable only")
    kwargs = parse_gather_kwargs(given.get("gather_kwarg", given.get("gather_kwargs", ())))
    output = parse_gather_output(given.get("gather_output"))
    init = parse_gather_init(given.get("gather_init", ()))
    for field, found in (
        ("gather_kwarg", bool(kwargs)), ("gather_output", output is not None), ("gather_init", bool(init))
    ):
        if found and gather_fn is None:
            raise OptionError(
                f"{{opt:{field}}} applies to a {{opt:gather_fn}} callable only (a module's functions are "
                "called as the contract says)"
            )
    if gather_fn is None:
        return {"gather": gather} if gather is not None else {}
    return {
        "gather": None,
        "gather_fn": gather_fn,
        "no_grad_fn": given.get("no_grad_fn"),
        "gather_form": form,
        "gather_kwargs": kwargs,
        "gather_output": output,
        "gather_init": init,
    }


def validate_gather(impl: Implementation) -> None:
    """Import the callables ``gather_fn`` and ``no_grad_fn`` name and check that each can be called as told."""
    for field, spec in (("gather_fn", impl.gather_fn), ("no_grad_fn", impl.no_grad_fn)):
        if spec is not None:
            try:
                found = resolve_callable(spec)
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}}: {exc.template}") from None
            check_call(field, spec, found, impl)


def gather_label(impl: Implementation) -> str:
    """How reports name the gather target: the callable (with its keywords and output index), else the module."""
    if impl.gather_fn is None:
        return impl.gather or "-"
    if not impl.gather_kwargs and impl.gather_output is None and not impl.gather_init:
        return str(impl.gather_fn)
    keywords = "".join(f", {name}={value}" for name, value in impl.gather_kwargs)
    built = f"({', '.join(f'{name}={value}' for name, value in impl.gather_init)})" if impl.gather_init else ""
    picked = "" if impl.gather_output is None else f"[{impl.gather_output}]"
    return f"{impl.gather_fn}{built}(x{keywords}){picked}"


def call_kwargs(impl: Implementation) -> dict[str, Any]:
    """The keywords ``gather_kwargs`` names, their values evaluated (a literal, or a ``Symbol`` for ``@name``)."""
    return {name: value_of(value) for name, value in impl.gather_kwargs}


def init_kwargs(impl: Implementation) -> dict[str, Any]:
    """The constructor keywords ``gather_init`` names, evaluated as :func:`call_kwargs` does."""
    return {name: value_of(value) for name, value in impl.gather_init}
