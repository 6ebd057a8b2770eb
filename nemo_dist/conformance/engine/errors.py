"""The errors of the conformance engine: what a check cannot do, and options that cannot work.

A check raises :class:`NotSupported` (the implementation lacks a feature
the check needs) or :class:`NotApplicable` (the check cannot apply to what
the implementation did); options that name no usable implementation raise
:class:`OptionError` (a usage error), whose message names options by field
(``{opt:gather_fn}``) so that each front end words it in its own option
names. Re-exported by :mod:`nemo_dist.conformance.engine.target`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from nemo_dist.conformance.engine.options import OPTIONS

__all__ = ["OPTION_FIELDS", "ChosenByCode", "MissingParameter", "NotApplicable", "NotSupported", "OptionError"]

#: Option fields an :class:`OptionError` message may name (as ``{opt:FIELD}``): every option of the table.
OPTION_FIELDS: tuple[str, ...] = tuple(option.dest for option in OPTIONS)
_OPTION_FIELD = re.compile(r"\{opt:(" + "|".join(OPTION_FIELDS) + r")\}")


class NotSupported(Exception):
    """The implementation lacks a feature a check needs (an extended-tier keyword, say)."""


class NotApplicable(Exception):
    """The check cannot apply to what the implementation did (no DDP object at world size 1, say)."""


class ChosenByCode(NotApplicable):
    """Not applicable because of what the code under test chose, not the world size or the environment.

    A DDP field check that finds no DDP object to inspect, or a comm hook of
    the code's own in the way of its observation. Reported as not applicable;
    a strict run blocks on it (a strict run demands the whole contract).
    """


class OptionError(ValueError):
    """Options that name no usable implementation; the message says what and how to fix it.

    The message names options by field (``{opt:gather_fn}``): :meth:`worded`
    says them as a front end calls them; ``str()`` gives the plain field names.
    """

    @property
    def template(self) -> str:
        """The message with its ``{opt:FIELD}`` placeholders."""
        return str(self.args[0]) if self.args else ""

    def worded(self, option: Callable[[str], str]) -> str:
        """The message with each option field replaced by ``option(field)`` (``"--gather-fn"``, say)."""
        return _OPTION_FIELD.sub(lambda m: option(m.group(1)), self.template)

    def __str__(self) -> str:
        return self.worded(lambda field: field)


class MissingParameter(OptionError):
    """The gather callable (or ``--ddp-fn`` wrapper) needs a parameter no option fills (``parameter``); a usage error.

    Raised before any world starts when the signature says so
    (:func:`~nemo_dist.conformance.engine.target.validate_implementation`), or by a
    run whose first call of the callable failed for it on every rank.
    """

    def __init__(self, template: str, parameter: str) -> None:
        super().__init__(template)
        self.parameter = parameter
