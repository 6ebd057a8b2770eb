"""Warnings recorded per thread, for checks that run in several threads of one process at once.

``warnings.catch_warnings`` changes process-wide state, so two threads that
each record the warnings of their own check would see each other's, and the
first to leave would restore the filters under the other. While a
:class:`ThreadWarnings` is installed (by the thread that starts the others,
around all of them), :func:`recording` and :func:`ignoring` file each warning
under the thread that raised it instead; with none installed they are plain
``catch_warnings`` blocks. A library that enters ``catch_warnings`` itself
inside a check still changes the process-wide state for its duration.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

__all__ = ["ThreadWarnings", "ignoring", "recording"]

_INSTALLED: ThreadWarnings | None = None


class ThreadWarnings:
    """While entered: every warning shown (filter "always") goes to the list of the thread that raised it.

    A thread with no list of its own (or a thread outside :func:`recording`
    and :func:`ignoring`) shows its warnings as Python would.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._saved: Any = None
        self._original: Any = None

    def __enter__(self) -> ThreadWarnings:
        global _INSTALLED
        if _INSTALLED is not None:
            raise RuntimeError("a ThreadWarnings is already installed")
        self._saved = warnings.catch_warnings()
        self._saved.__enter__()
        warnings.simplefilter("always")
        self._original = warnings.showwarning
        warnings.showwarning = self._show
        _INSTALLED = self
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        global _INSTALLED
        _INSTALLED = None
        self._saved.__exit__(kind, exc, tb)

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        target: list[warnings.WarningMessage] | None = getattr(self._local, "target", None)
        if target is not None:
            target.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        elif not getattr(self._local, "ignoring", False):
            self._original(message, category, filename, lineno, file, line)

    @contextmanager
    def _filed(self, target: list[warnings.WarningMessage] | None, ignore: bool) -> Iterator[None]:
        previous = getattr(self._local, "target", None), getattr(self._local, "ignoring", False)
        self._local.target, self._local.ignoring = target, ignore
        try:
            yield
        finally:
            self._local.target, self._local.ignoring = previous


@contextmanager
def recording() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning this thread raises in the body (filter "always") into the list yielded."""
    if _INSTALLED is not None:
        caught: list[warnings.WarningMessage] = []
        with _INSTALLED._filed(caught, ignore=False):
            yield caught
        return
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        yield recorded


@contextmanager
def ignoring() -> Iterator[None]:
    """Drop every warning this thread raises in the body."""
    if _INSTALLED is not None:
        with _INSTALLED._filed(None, ignore=True):
            yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
