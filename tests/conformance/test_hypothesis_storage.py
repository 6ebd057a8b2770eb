"""Where a conformance run leaves hypothesis's files: a cache directory, or nowhere, never the current directory.

Layers cheapest first: :func:`hypothesis_settings` in this process (no process
group), then the command (in a gloo world of two ranks: test_cli's run of the
reference) and ``pytest conformance/`` (of one rank) as subprocesses started
from an empty directory.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import Phase, core, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from nemo_dist.conformance.engine.profile import (
    changed_profile,
    default_hypothesis_dir,
    hypothesis_settings,
    parse_hypothesis_db,
    resolve_hypothesis_db,
    seeded,
)
from tests.conformance._cli import (
    PYTEST_FAILING_ARGS,
    REFERENCE_ARGS,
    ROOT,
    DirectoryRun,
    clean_env,
    pytest_failing_run_group,
    reference_run_group,
)


def _fail_on_one(database: Path | None, seed: int = 7, *, reuse_only: bool = False) -> list[int]:
    """Run a property that fails for n >= 1 as a conformance run does (settings with ``database``, ``seed``).

    Returns the examples it was called with. ``reuse_only``: hypothesis only
    replays its database (no example of its own), so the property is called
    only with what an earlier run saved there.
    """
    seen: list[int] = []
    phases = {"phases": [Phase.reuse]} if reuse_only else {}
    # Decorated inside: @given takes the settings active when it is applied, as the checks' own properties do.
    with hypothesis_settings(20, database=database), seeded(seed), changed_profile(**phases):

        @given(st.integers(0, 10))
        def prop(n: int) -> None:
            seen.append(n)
            assert n < 1

        with pytest.raises(AssertionError):
            prop()
    return seen


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


@pytest.mark.parametrize("ci", ["", "true"], ids=["local", "ci-environment"])
def test_failing_example_is_saved_under_the_given_directory_not_the_cwd(
    ci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a directory, the failing example lands in its examples/ database; the cwd gets no .hypothesis.

    Also with ``CI`` set: hypothesis then loads, on import, its own derandomized
    profile without a database, which a conformance run must not inherit.
    """
    cwd, db = tmp_path / "cwd", tmp_path / "db"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    # A fresh interpreter: hypothesis chooses its CI profile when it is imported.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.conformance.test_hypothesis_storage import _fail_on_one\n"
        "_fail_on_one(Path(sys.argv[1]))\n"
    )
    env = {**clean_env(), "PYTHONPATH": str(ROOT)}
    env.pop("CI", None)
    if ci:
        env["CI"] = ci
    done = subprocess.run([sys.executable, "-c", script, str(db)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert _files(db / "examples"), list(db.rglob("*"))
    assert list(cwd.iterdir()) == []


def test_a_seeded_run_replays_the_failing_example_an_earlier_run_saved(tmp_path: Path) -> None:
    """The database works under a seed: a second run, with another seed and only replay, fails on the saved n=1.

    Hypothesis's own forced seed (``--hypothesis-seed``) turns the database
    off; a conformance run is always seeded, and must keep it.
    """
    first = _fail_on_one(tmp_path, seed=7)
    assert 1 in first
    assert _files(tmp_path / "examples")
    assert set(_fail_on_one(tmp_path, seed=8, reuse_only=True)) == {1}


def test_seeded_draws_from_the_innermost_seed_and_restores_hypothesis(tmp_path: Path) -> None:
    """Nested seeds: the inner one is drawn from; after both, hypothesis's hook and forced seed are as before."""
    hook, forced = core.get_random_for_wrapped_test, core.global_force_seed

    def draws() -> list[int]:
        seen: list[int] = []
        with changed_profile(max_examples=5, database=None, derandomize=False):

            @given(st.integers(0, 2**30))
            def prop(n: int) -> None:
                seen.append(n)

            prop()
        return seen

    with seeded(1):
        outer = draws()
        with seeded(2):
            inner = draws()
        assert draws() == outer
    with seeded(2):
        assert draws() == inner
    assert inner != outer
    assert (core.get_random_for_wrapped_test, core.global_force_seed) == (hook, forced)


def test_no_database_keeps_no_example_and_writes_nothing_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a directory, hypothesis has no database during the run and leaves no file in the cwd."""
    monkeypatch.chdir(tmp_path)
    with hypothesis_settings(5):
        assert settings.default is not None
        assert settings.default.database is None
    _fail_on_one(None)
    assert list(tmp_path.iterdir()) == []


def test_the_database_is_a_directory_database_under_examples(tmp_path: Path) -> None:
    """During the run the active database is a DirectoryBasedExampleDatabase at DIR/examples; afterwards the old one."""
    before = settings.default
    with hypothesis_settings(5, database=tmp_path):
        assert settings.default is not None
        database = settings.default.database
        assert isinstance(database, DirectoryBasedExampleDatabase)
        assert database == DirectoryBasedExampleDatabase(tmp_path / "examples")
    assert settings.default is not None
    assert before is not None
    assert settings.default.max_examples == before.max_examples


@pytest.mark.parametrize(
    ("xdg", "expected"),
    [("/xdg/cache", Path("/xdg/cache/nemo_dist/hypothesis")), ("", None), ("relative/cache", None)],
    ids=["xdg-absolute", "xdg-empty", "xdg-relative-ignored"],
)
def test_default_directory_is_in_the_users_cache(
    xdg: str, expected: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$XDG_CACHE_HOME/nemo_dist/hypothesis when it is absolute, else ~/.cache/nemo_dist/hypothesis."""
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert default_hypothesis_dir() == (expected or Path.home() / ".cache" / "nemo_dist" / "hypothesis")


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "expects a directory or 'none'; got an empty value"), (__file__, "exists and is not a directory")],
    ids=["empty", "a-file"],
)
def test_bad_database_value_is_refused_naming_the_problem(text: str, message: str) -> None:
    """An empty value or an existing file is a ValueError saying what is wrong; 'none' means no database."""
    with pytest.raises(ValueError, match=message):
        parse_hypothesis_db(text)
    assert parse_hypothesis_db("none") is None


def test_default_directory_that_cannot_be_created_means_no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache directory under a file (a read-only home, say) is no usage error: the run keeps no database."""
    monkeypatch.setenv("XDG_CACHE_HOME", __file__)
    assert resolve_hypothesis_db(None) is None
    with pytest.raises(ValueError, match="cannot be used"):
        resolve_hypothesis_db(f"{__file__}/db")


@reference_run_group
@pytest.mark.parametrize(
    ("extra", "in_cache"),
    # "none" in process: test_no_database_keeps_no_example_and_writes_nothing_in_the_cwd
    [((), True), pytest.param(("--hypothesis-db", "none"), False, marks=pytest.mark.thorough)],
    ids=["default", "none"],
)
def test_command_writes_no_hypothesis_directory_in_the_cwd(
    extra: tuple[str, ...], in_cache: bool, command_from_empty_dir: Callable[..., DirectoryRun]
) -> None:
    """From an empty directory the command leaves it empty; hypothesis's files go to the cache, or with none nowhere.

    The default's run is test_cli's run of the reference (its exit status and table are read there).
    """
    result, cwd, cache = command_from_empty_dir(*REFERENCE_ARGS, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(cwd.iterdir()) == [], list(cwd.rglob("*"))
    if in_cache:
        assert (cache / "nemo_dist" / "hypothesis").is_dir(), list(cache.rglob("*"))
    else:
        assert list(cache.iterdir()) == [], list(cache.rglob("*"))


@pytest_failing_run_group
def test_pytest_front_end_writes_no_hypothesis_directory_in_the_cwd(
    python_from_empty_dir: Callable[..., DirectoryRun],
) -> None:
    """``pytest conformance/`` started elsewhere leaves the cwd without .hypothesis; the cache directory gets it,
    with the failing example it saved.

    The run (a fork failing one check) is test_pytest_mode's; its failures are read there.
    """
    result, cwd, cache = python_from_empty_dir(*PYTEST_FAILING_ARGS)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 skipped" in result.stdout, result.stdout
    assert not (cwd / ".hypothesis").exists(), list(cwd.rglob("*"))
    assert _files(cache / "nemo_dist" / "hypothesis" / "examples"), list(cache.rglob("*"))


def test_pytest_front_end_refuses_a_bad_database_value(pytester: pytest.Pytester) -> None:
    """An empty --conformance-hypothesis-db is a pytest usage error naming the option and the way out."""
    # In this process: the usage error stops pytest before anything runs (conformance is imported above, so its
    # plugin cannot be assert-rewritten again: pytest's warning of that is no finding here).
    result = pytester.runpytest_inprocess(
        str(ROOT / "conformance"), "-p", "no:cacheprovider", "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--conformance-hypothesis-db", "",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "--conformance-hypothesis-db expects a directory or 'none'" in result.stderr.str()
