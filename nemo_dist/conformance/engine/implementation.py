"""What a conformance run checks: an :class:`Implementation`, the value of every field the suites declare.

Each suite declares its component's fields (:class:`~nemo_dist.conformance.engine.declarations.SuiteTarget`):
module paths, callables as ``module:name``, how to call them. An implementation holds the values given and
answers every declared field by attribute (``impl.gather``), a field not given with its suite's declared
default. Only plain values travel to the ranks; each rank imports what they name itself. How options become
an implementation is :mod:`.target`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from functools import cache
from types import ModuleType
from typing import Any

from nemo_dist.conformance.engine.declarations import suite_targets
from nemo_dist.conformance.engine.errors import NotSupported

__all__ = ["Implementation", "declared_defaults", "declared_fields"]


@cache
def declared_fields() -> tuple[str, ...]:
    """Every field an implementation can hold: each suite's fields and settings, in the suites' order."""
    return tuple(dict.fromkeys(f for t in suite_targets() for f in (*t.fields, *t.settings)))


@cache
def declared_defaults() -> Mapping[str, Any]:
    """What an implementation holds for a declared field not given (None where its suite declares no default)."""
    found: dict[str, Any] = dict.fromkeys(declared_fields())
    for target in suite_targets():
        found.update(target.defaults)
    return found


class Implementation:
    """What to check: the value of each field the suites declare, ``Implementation(gather="my.fork.dist_utils")``.

    Keywords are declared fields (a ``TypeError`` names any other); ``suite_options`` are more ``(field,
    value)`` pairs. A field not given holds its suite's default: the bundled gather, ddp, config and fsdp2
    modules, so ``Implementation(gather="my.fork")`` checks a fork's all-gather with the bundled modules
    serving the rest. Every declared field reads as an attribute. Values are texts, tuples of texts or frozen
    data (a ``--ddp-fn`` wrapper); the object is immutable, hashable, compares by what every field holds and
    pickles as its values.
    """

    __slots__ = ("_given", "suite_options")
    #: The values given, as ``(field, value)`` pairs in the declared fields' order.
    suite_options: tuple[tuple[str, Any], ...]

    def __init__(self, suite_options: Iterable[tuple[str, Any]] = (), **fields: Any) -> None:
        unknown = sorted(set(fields) - set(declared_fields()))
        if unknown:
            raise TypeError(
                f"Implementation() got unexpected keyword arguments {', '.join(unknown)}; the suites declare "
                f"{', '.join(declared_fields())}"
            )
        values = {**dict(suite_options), **fields}
        order = {f: i for i, f in enumerate(declared_fields())}
        pairs = tuple(sorted(values.items(), key=lambda item: order.get(item[0], len(order))))
        object.__setattr__(self, "suite_options", pairs)
        object.__setattr__(self, "_given", dict(pairs))  # read on every attribute: built once

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "suite_options" or name not in declared_defaults():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.suite_option(name, declared_defaults()[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"an Implementation is immutable; use replaced({name}=...)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (self.suite_options,))

    def _held(self) -> tuple[tuple[str, Any], ...]:
        given = self._given
        return (*((f, given.get(f, d)) for f, d in declared_defaults().items()),
                *sorted((f, repr(v)) for f, v in given.items() if f not in declared_defaults()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Implementation) and self._held() == other._held()

    def __hash__(self) -> int:
        return hash(self._held())

    def __repr__(self) -> str:
        return f"Implementation({', '.join(f'{f}={v!r}' for f, v in self.suite_options)})"

    def suite_option(self, field: str, default: Any = None) -> Any:
        """The value field ``field`` was given here (``default`` when it was not)."""
        return self._given.get(field, default)

    def value(self, field: str) -> Any:
        """What field ``field`` holds: the value given, else its declared default (None for an undeclared one)."""
        return self.suite_option(field, declared_defaults().get(field))

    def replaced(self, **fields: Any) -> Implementation:
        """This implementation with ``fields`` holding new values (the others as they are)."""
        return Implementation(suite_options=(*self.suite_options, *fields.items()))

    def module(self, field: str) -> ModuleType:
        """Import and return the module field ``field`` names ("gather", "tp", ...).

        Raises ``NotSupported`` when it names none in this implementation.
        """
        path = self.value(field)
        if path is None:
            raise NotSupported(f"no {field} module was named")
        return importlib.import_module(path)


def _rebuilt(values: tuple[tuple[str, Any], ...]) -> Implementation:
    """An implementation from its pickled values."""
    return Implementation(suite_options=values)
