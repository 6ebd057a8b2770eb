"""A hypothesis profile for the length of one test: the active settings with some changed."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from hypothesis import settings

__all__ = ["changed_profile"]

_NAMES = itertools.count()


@contextlib.contextmanager
def changed_profile(**changes: Any) -> Iterator[None]:
    """Load the active hypothesis settings with ``changes`` for the body, then load the previous ones again.

    Each use registers under its own names, so nothing reloading a profile by
    name later picks up these changes.
    """
    previous = settings.default
    assert previous is not None
    number = next(_NAMES)
    settings.register_profile(f"tests_changed_{number}", previous, **changes)
    settings.load_profile(f"tests_changed_{number}")
    try:
        yield
    finally:
        settings.register_profile(f"tests_restored_{number}", previous)
        settings.load_profile(f"tests_restored_{number}")
