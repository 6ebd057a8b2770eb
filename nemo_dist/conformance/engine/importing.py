"""Importing what an option names: a module path, or a ``MODULE:NAME`` callable; a failure is a usage error.

Both the implementation's modules and callables (:mod:`.target`) and a
``--ddp-fn`` wrapper (:mod:`.wrapping`) are imported through here, before any
world starts and again on each rank. A failure is an
:class:`~nemo_dist.conformance.engine.errors.OptionError` carrying the reason in
one line. Imports nothing of the engine but :mod:`.errors`.
"""

from __future__ import annotations

import importlib
import traceback
from types import ModuleType
from typing import Any

from nemo_dist.conformance.engine.errors import OptionError

__all__ = ["import_path", "made", "resolve_callable"]

#: What each ``MODULE:NAME()`` factory returned in this process, by ``MODULE:NAME``.
_MADE: dict[str, Any] = {}


def import_path(path: str) -> ModuleType:
    """Import module ``path`` and return it.

    Raises ``OptionError`` whose message is the import's error in one line
    (``Type: message``), with a hint where to find a module that was not found.
    """
    try:
        return importlib.import_module(path)
    except Exception as exc:
        hint = (
            " (is it on sys.path? run from the checkout that holds it, or pip install it)"
            if isinstance(exc, ModuleNotFoundError)
            else ""
        )
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        raise OptionError(f"{last}{hint}") from None


def resolve_callable(
    spec: str,
    example: str = "torch.distributed.nn.functional:all_gather",
    what: str = "a function or autograd Function",
) -> Any:
    """Import ``"module:name"`` (``name`` may be dotted) and return the object.

    Raises ``OptionError`` saying what is wrong with the spec (``example``
    shows a good one; ``what`` says what the object must be).
    """
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise OptionError(f"expected MODULE:NAME, such as {example}; got {spec!r}")
    try:
        module = import_path(module_name)
    except OptionError as exc:
        raise OptionError(f"module {module_name!r} does not import: {exc.template}") from None
    found: Any = module
    for part in qualname.split("."):
        if not hasattr(found, part):
            raise OptionError(f"{module_name!r} has no {qualname!r} (from {spec!r})")
        found = getattr(found, part)
    if not callable(found):
        raise OptionError(f"{spec!r} is a {type(found).__name__}, not {what}")
    return found


def made(path: str) -> Any:
    """What the factory ``path`` (``MODULE:NAME``) returns when called with no arguments: called once per process.

    A rank fills a ``MODULE:NAME()`` option value with it, so every call of the
    code under test on that rank gets the same object. Raises what
    :func:`resolve_callable` raises, or what the factory raises.
    """
    if path not in _MADE:
        _MADE[path] = resolve_callable(path, "mypackage.envs:make_environment", "a factory")()
    return _MADE[path]
