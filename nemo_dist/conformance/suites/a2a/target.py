"""How the a2a suite calls what it checks: one autograd all-to-all, and a module's token dispatch and combine.

What is checked is a module (``--a2a``) with
``all_to_all_with_grad(tensor, output_split_sizes, input_split_sizes,
group)`` (and ``dispatch_tokens`` / ``combine_tokens`` where it has them), or
one callable (``--a2a-fn``): a function, or a ``torch.autograd.Function``
subclass called through ``.apply``. A callable's parameters named like a
symbol of :data:`~nemo_dist.conformance.suites.a2a.options.A2A_SYMBOLS` are filled
with it, ``--a2a-kwarg`` fills (or overrides) any other, and the tensor goes
where ``@input`` is, else to the first parameter. A callable given no split
sizes can only split equally, so the checks draw equal splits for it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dist.conformance.adapters.callables import parse_keyword_pairs
from nemo_dist.conformance.adapters.signature import arguments, is_function_class
from nemo_dist.conformance.adapters.symbols import Factory, Symbol, value_of
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import import_path, resolve_callable
from nemo_dist.conformance.suites.a2a.options import A2A_SYMBOLS
from nemo_dist.conformance.suites.gather.calls import landed

__all__ = ["Caller", "caller", "module_function", "validate"]

_SPLITS = ("input_split_sizes", "output_split_sizes")


@dataclass(frozen=True)
class Caller:
    """One resolved all-to-all: the callable, the values of its parameters (symbols among them) and what it takes."""

    found: Any
    label: str
    values: tuple[tuple[str, Any], ...]
    parameters: tuple[inspect.Parameter, ...] | None

    @property
    def function_class(self) -> bool:
        """Whether it is an autograd Function (called through ``.apply``, values by position)."""
        return is_function_class(self.found)

    def _symbols(self) -> set[str]:
        return {v.name for _, v in self.values if isinstance(v, Symbol)}

    @property
    def uneven(self) -> bool:
        """Whether it is told where each row goes (``@input_split_sizes``): it can split unevenly."""
        return "input_split_sizes" in self._symbols()

    @property
    def both_splits(self) -> bool:
        """Whether it is told both split sizes, so a call can give them disagreeing between ranks."""
        return set(_SPLITS) <= self._symbols()

    @property
    def grouped(self) -> bool:
        """Whether it is passed the call's process group (``@group``)."""
        return "group" in self._symbols()

    def __call__(self, tensor: torch.Tensor, sent: Sequence[int], received: Sequence[int], group: Any) -> Any:
        """Call it on ``tensor``: ``sent[j]`` rows to rank j, ``received[i]`` from rank i, over ``group``."""
        import torch.distributed as dist

        filled = {
            "input": tensor,
            "input_split_sizes": list(sent),
            "output_split_sizes": list(received),
            "group": group,
            "rank": dist.get_rank(group) if dist.is_initialized() else 0,
            "world_size": len(sent),
        }
        values: dict[str, Any] = {}
        for name, value in self.values:
            if isinstance(value, Symbol):
                values[name] = (
                    tensor.new_empty((sum(received), *tensor.shape[1:])) if value.name == "output"
                    else filled[value.name]
                )
            else:
                values[name] = resolve_callable(value.path)() if isinstance(value, Factory) else value
        args, kwargs = arguments(self.parameters, values, self.function_class)
        if self.function_class:
            return landed(self.found.apply(*args))
        return landed(self.found(*args, **kwargs))


def _parameters(found: Any) -> tuple[inspect.Parameter, ...] | None:
    """Every parameter a call fills (``forward``'s after ``ctx`` for an autograd Function); None if unreadable."""
    fn, skip = found, 0
    if is_function_class(found):
        fn = found.forward
        skip = 1 if found.setup_context is torch.autograd.Function.setup_context else 0
    try:
        return tuple(list(inspect.signature(fn).parameters.values())[skip:])
    except (TypeError, ValueError):
        return None


def _values(parameters: tuple[inspect.Parameter, ...] | None, given: dict[str, str]) -> dict[str, Any]:
    """The value of each parameter a call fills: ``given`` (stored texts), then symbols by name, the tensor first."""
    values = {name: value_of(text) for name, text in given.items()}
    names = [p.name for p in parameters or () if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for name in names:
        if name in A2A_SYMBOLS and name not in values:
            values[name] = Symbol(name)
    if not any(isinstance(v, Symbol) and v.name == "input" for v in values.values()):
        first = next((n for n in names if n not in values), None)
        if first is None:
            raise OptionError(
                "{opt:a2a_fn} has no parameter left for the tensor; pass it by name: {opt:a2a_kwarg} NAME=@input"
            )
        values[first] = Symbol("input")
    return values


def module_function(impl: Implementation, name: str) -> Any:
    """``name`` of the ``--a2a`` module (None when there is no module or it lacks ``name``)."""
    path = impl.suite_option("a2a")
    return None if path is None or impl.suite_option("a2a_fn") else getattr(import_path(path), name, None)


@functools.lru_cache(maxsize=8)
def _caller(fn_path: str | None, module: str | None, kwargs: tuple[str, ...]) -> Caller:
    if fn_path is not None:
        found, label = resolve_callable(fn_path, "mypackage.moe:all_to_all", "an all-to-all"), fn_path
    else:
        assert module is not None
        found, label = import_path(module).all_to_all_with_grad, f"{module}.all_to_all_with_grad"
    given = parse_keyword_pairs(kwargs, "a2a_kwarg", tuple(A2A_SYMBOLS), "input_split_sizes=@input_split_sizes")
    parameters = _parameters(found)
    values = _values(parameters, given)
    if parameters is not None:
        names = {p.name for p in parameters}
        absorbs = any(p.kind is p.VAR_KEYWORD for p in parameters) and not is_function_class(found)
        unknown = [n for n in values if n not in names and not absorbs]
        if unknown:
            raise OptionError(f"{{opt:a2a_kwarg}} names {', '.join(unknown)}, which {label} does not take")
        unfilled = [p.name for p in parameters if p.default is p.empty and p.name not in values
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if unfilled:
            raise OptionError(
                f"{label} needs {', '.join(unfilled)}, which the checks do not fill: name each with "
                "{opt:a2a_kwarg} NAME=VALUE (a literal or a symbol such as @input_split_sizes)"
            )
    return Caller(found, label, tuple(values.items()), parameters)


def caller(impl: Implementation) -> Caller:
    """The all-to-all ``impl`` names, resolved (once per process); ``OptionError`` naming what cannot work."""
    return _caller(impl.suite_option("a2a_fn"), impl.suite_option("a2a"), tuple(impl.suite_option("a2a_kwarg", ())))


def validate(impl: Implementation) -> None:
    """Resolve what the a2a options name (in the parent, before any world starts); ``OptionError`` naming it."""
    if impl.suite_option("a2a_kwarg") and impl.suite_option("a2a_fn") is None:
        raise OptionError("{opt:a2a_kwarg} applies to a {opt:a2a_fn} callable only (a module's functions are "
                          "called as the contract says)")
    if impl.suite_option("a2a_fn") is not None and impl.suite_option("a2a") is not None:
        raise OptionError("{opt:a2a} names a module and {opt:a2a_fn} a callable; give one of them")
    if impl.suite_option("a2a_fn") is not None or impl.suite_option("a2a") is not None:
        caller(impl)
