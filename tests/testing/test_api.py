"""Harness layer 0 (no rank process): public names, argument checks, pickling errors.

Nothing here starts a rank process, except the subprocess that proves the
plugin imports no torch.
"""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import threading

import pytest

import nemo_dist.testing as testing
from nemo_dist.testing import (
    FunctionNotPicklable,
    RankFailure,
    World,
    WorldTimeout,
    calls,
    options,
    plugin,
    processes,
    profiles,
)
from tests.testing import rank_fns


@pytest.mark.parametrize("module", [testing, plugin, profiles, processes, calls, options], ids=lambda m: m.__name__)
def test_all_names_resolve(module: object) -> None:
    """Every name in a public module's __all__ exists; its functions and classes have docstrings."""
    for name in module.__all__:  # type: ignore[attr-defined]
        assert hasattr(module, name), name
        value = getattr(module, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


def test_public_api_names() -> None:
    """The names other code imports are exported."""
    assert {"World", "RankFailure", "WorldTimeout"} <= set(testing.__all__)


@pytest.mark.parametrize("module", ["nemo_dist.testing", "nemo_dist.testing.plugin"])
def test_import_does_not_import_torch(module: str) -> None:
    """Importing the harness package or the plugin leaves torch unimported."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "World size must be an int >= 1, got 0"),
        ({"size": "2"}, "World size must be an int >= 1, got '2'"),
        ({"size": 2, "backend": ""}, "World backend must be a backend name"),
        ({"size": 2, "timeout": 0}, "World timeout must be a number of seconds > 0, got 0"),
        ({"size": 2, "grace": -1.0}, "World grace must be a number of seconds > 0"),
    ],
    ids=["size-zero", "size-str", "backend-empty", "timeout-zero", "grace-negative"],
)
def test_invalid_world_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    """Invalid World arguments raise ValueError naming the field and value."""
    with pytest.raises(ValueError, match=message):
        World(**kwargs)


def _local_fn() -> int:
    return 0


@pytest.mark.parametrize(
    ("fn", "args", "fragment"),
    [
        (lambda: 0, (), "<lambda>"),
        (None, (), "<locals>"),
        (rank_fns.echo, (threading.Lock(),), "arguments of tests.testing.rank_fns.echo"),
    ],
    ids=["lambda", "nested-function", "unpicklable-argument"],
)
def test_unpicklable_call_raises_before_start(fn, args, fragment: str) -> None:  # type: ignore[no-untyped-def]
    """A lambda, a nested function or an unpicklable argument fails in the parent, clearly."""
    if fn is None:

        def nested() -> int:
            return 0

        fn = nested
    with World(2) as world:
        with pytest.raises(FunctionNotPicklable, match="cannot send") as info:
            world.run(fn, *args)
        assert world.pids == []  # nothing was started
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, pickle.PicklingError)
    assert fragment in str(info.value)
    if "arguments" not in fragment:
        assert "module-level function" in str(info.value)


def test_run_after_close_raises() -> None:
    """A closed World refuses to run, saying it is closed."""
    world = World(1)
    world.close()
    world.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        world.run(rank_fns.echo)


def test_errors_pickle_round_trip() -> None:
    """RankFailure and WorldTimeout survive pickling (xdist, hypothesis) with their fields."""
    failure = RankFailure({1: "rank 1 raised ValueError: x"}, {0: 0}, 2)
    again = pickle.loads(pickle.dumps(failure))
    assert again.failures == failure.failures
    assert str(again) == str(failure)
    timeout = WorldTimeout(1.5, {0: "stack"}, 2)
    again_t = pickle.loads(pickle.dumps(timeout))
    assert again_t.stacks == {0: "stack"}
    assert str(again_t) == str(timeout)
    assert isinstance(timeout, TimeoutError)
