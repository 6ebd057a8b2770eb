"""The hypothesis settings and seed of a conformance run, applied for its duration and then restored.

Hypothesis keeps its example database and caches under one directory, by
default ``.hypothesis/`` in the current directory. A conformance run puts them
under a directory it is given (the front ends' default:
:func:`default_hypothesis_dir`, in the user's cache directory), or, with no
database, in a temporary directory removed afterwards: never in the directory
the user runs the command from.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "NO_DATABASE",
    "changed_profile",
    "default_hypothesis_dir",
    "hypothesis_settings",
    "new_seed",
    "parse_hypothesis_db",
    "resolve_hypothesis_db",
    "seeded",
]


def new_seed() -> int:
    """A fresh random seed for a run (printed with its failures, so any of them can be re-run alone)."""
    return random.SystemRandom().randrange(2**32)


#: Held while a test draws its Random under a forced seed.
_FORCING = threading.Lock()


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Every hypothesis test run in the body draws from ``Random(seed)`` (None: leave hypothesis as it is).

    A check run alone with the same seed draws the same examples, so it finds
    and shrinks to the same failure; the example database stays in use (a
    failing example is saved, and replayed first by the next run that has
    the database). ``derandomize`` (torchrun) and a test's own ``@seed`` take
    precedence over it.
    """
    from hypothesis import core

    if seed is None:
        yield
        return
    previous = core.global_force_seed
    current: Any = getattr(core, "get_random_for_wrapped_test", None)
    draw = getattr(current, "__wrapped__", current)  # nested: the innermost seed is the one drawn from
    if draw is None:  # a hypothesis without the hook: seeded all the same, without the database
        core.global_force_seed = seed  # type: ignore[assignment]
    else:
        # hypothesis's own forced seed (``pytest --hypothesis-seed``) also turns
        # the example database off. So the seed is forced only while a test draws
        # its Random (hypothesis's precedence kept: a test's @seed, derandomize, then it).
        def seeded_random(test: Any, wrapped_test: Any) -> Any:
            with _FORCING:  # checks in several threads (lanes) draw one at a time
                core.global_force_seed = seed  # type: ignore[assignment]
                try:
                    return draw(test, wrapped_test)
                finally:
                    core.global_force_seed = None

        seeded_random.__wrapped__ = draw  # type: ignore[attr-defined]
        core.global_force_seed = None
        core.get_random_for_wrapped_test = seeded_random
    try:
        yield
    finally:
        if draw is not None:
            core.get_random_for_wrapped_test = current
        core.global_force_seed = previous


_PROFILE = "nemo_dist_conformance"
_RESTORE_PROFILE = "nemo_dist_conformance_restore"
# Profile names of their own for each use: whoever later reloads the current
# profile by name (a fixture restoring "the profile that was active") gets that
# use's settings, not those of a later, nested use registered under the same name.
_USES = itertools.count()

#: The ``--hypothesis-db`` value that keeps no example database.
NO_DATABASE = "none"


def default_hypothesis_dir() -> Path:
    """``$XDG_CACHE_HOME/nemo_dist/hypothesis``, or ``~/.cache/nemo_dist/hypothesis`` when it is unset or relative."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "nemo_dist" / "hypothesis"


def parse_hypothesis_db(text: str) -> Path | None:
    """The directory an ``--hypothesis-db`` value names (``~`` expanded), or None for :data:`NO_DATABASE`.

    Raises ``ValueError`` saying what is wrong for an empty value or a path
    that exists and is not a directory.
    """
    if text.strip().lower() == NO_DATABASE:
        return None
    if not text.strip():
        raise ValueError(f"expects a directory or {NO_DATABASE!r}; got an empty value")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{text!r} exists and is not a directory; give a directory or {NO_DATABASE!r}")
    return path


def _writable(path: Path) -> str:
    """Create ``path`` if needed; "" when it is a writable directory, else the reason it is not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return "" if os.access(path, os.W_OK | os.X_OK) else "not writable"


def resolve_hypothesis_db(text: str | None) -> Path | None:
    """The directory a front end's ``--hypothesis-db`` value gives (None: no database), created if missing.

    ``text`` None means the default, :func:`default_hypothesis_dir`, or no
    database when that cannot be created or written (a read-only home, say).
    A named directory that cannot be is a ``ValueError`` saying why, as is
    any value :func:`parse_hypothesis_db` refuses.
    """
    if text is None:
        default = default_hypothesis_dir()
        return None if _writable(default) else default
    path = parse_hypothesis_db(text)
    if path is not None and (reason := _writable(path)):
        raise ValueError(f"{text!r} cannot be used ({reason}); give a writable directory or {NO_DATABASE!r}")
    return path


@contextmanager
def _hypothesis_home(directory: Path | None) -> Iterator[Path]:
    """Point hypothesis's storage (database default, caches) at ``directory``, or a temporary one; then undo it.

    Undoing means hypothesis's own default again (``HYPOTHESIS_STORAGE_DIRECTORY``
    or ``.hypothesis/`` in the current directory, resolved on next use).
    """
    from hypothesis.configuration import set_hypothesis_home_dir

    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nemo_dist_hypothesis_")))
        set_hypothesis_home_dir(directory)
        try:
            yield directory
        finally:
            set_hypothesis_home_dir(None)


@contextmanager
def hypothesis_settings(
    max_examples: int | None, *, derandomize: bool = False, database: Path | None = None
) -> Iterator[None]:
    """Run the body under conformance hypothesis settings, then restore the previous ones.

    ``database``: the directory hypothesis keeps its files under for the run
    (the example database in ``examples/``, its caches beside it); None: no
    example database, and its caches in a temporary directory removed
    afterwards. No deadline, no ``too_slow`` health check, no ``explain``
    phase; ``max_examples`` when given (else the active profile's).
    ``derandomize`` makes every process draw the same examples (torchrun
    mode; hypothesis then keeps no database). Without it the run is random,
    drawn from its seed (:func:`seeded`), whatever the active profile says:
    hypothesis loads a derandomized, database-less profile by itself when it
    sees a CI environment variable, and a run inheriting that would draw the
    same examples for every seed, so a failure's ``--seed`` would not
    reproduce it anywhere else.
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    previous = settings.default
    assert previous is not None
    changes: dict[str, object] = {
        "deadline": None,
        "suppress_health_check": [*previous.suppress_health_check, HealthCheck.too_slow],
    }
    if max_examples is not None:
        changes["max_examples"] = max_examples
    # "explain" replays examples to list the lines only failing cases ran:
    # noise in a verdict table, extra time, and one more thing that could
    # differ between ranks under torchrun.
    changes["phases"] = [p for p in previous.phases if p is not Phase.explain]
    changes["derandomize"] = derandomize  # True implies no database
    if not derandomize:
        changes["database"] = None if database is None else DirectoryBasedExampleDatabase(database / "examples")
    with _hypothesis_home(database), changed_profile(**changes):
        yield


@contextmanager
def changed_profile(**changes: Any) -> Iterator[None]:
    """Load the active hypothesis settings with ``changes`` for the body, then the previous settings again."""
    from hypothesis import settings

    previous = settings.default
    assert previous is not None
    number = next(_USES)
    settings.register_profile(f"{_PROFILE}_{number}", previous, **changes)
    settings.load_profile(f"{_PROFILE}_{number}")
    try:
        yield
    finally:
        settings.register_profile(f"{_RESTORE_PROFILE}_{number}", previous)
        settings.load_profile(f"{_RESTORE_PROFILE}_{number}")
