"""Parsers of the harness's option values: world sizes, seconds, counts.

One parser per kind of value, shared by every front end (the pytest plugin's
``--dist-*`` options, environment variables). A malformed value raises
:class:`BadOptionValue` carrying the offending text, and each front end words
its own message (a ``pytest.UsageError`` naming its option, for the plugin).
"""

from __future__ import annotations

import math

__all__ = ["BadOptionValue", "parse_count", "parse_positive_int", "parse_seconds", "parse_world_sizes"]


class BadOptionValue(ValueError):
    """A malformed option value.

    ``value`` is the offending text (for a list, the offending item) and
    ``text`` the whole input it came from.
    """

    def __init__(self, value: str, text: str | None = None) -> None:
        self.value = value
        self.text = value if text is None else text
        where = "" if self.text == value else f" in {self.text!r}"
        super().__init__(f"bad value {value!r}{where}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.value, self.text))


def _parse_int(text: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise BadOptionValue(str(text)) from None
    if value < minimum:
        raise BadOptionValue(str(text))
    return value


def parse_positive_int(text: str) -> int:
    """The int >= 1 that ``text`` spells (surrounding spaces allowed); BadOptionValue otherwise."""
    return _parse_int(text, 1)


def parse_count(text: str) -> int:
    """The int >= 0 that ``text`` spells (surrounding spaces allowed); BadOptionValue otherwise."""
    return _parse_int(text, 0)


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """The world sizes of a comma-separated list such as ``"1,2,4"``, duplicates dropped, order kept.

    Every item must be an int >= 1; the first one that is not raises
    BadOptionValue with ``value`` the item and ``text`` the whole list.
    """
    sizes: list[int] = []
    for part in str(text).split(","):
        try:
            size = parse_positive_int(part)
        except BadOptionValue:
            raise BadOptionValue(part, str(text)) from None
        if size not in sizes:
            sizes.append(size)
    return tuple(sizes)


def parse_seconds(text: str) -> float:
    """The finite number of seconds > 0 that ``text`` spells; BadOptionValue otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise BadOptionValue(str(text)) from None
    if not value > 0 or not math.isfinite(value):
        raise BadOptionValue(str(text))
    return value
