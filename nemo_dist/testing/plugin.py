"""pytest plugin of nemo_dist: persistent worlds, markers, options, profiles.

Registered through the ``pytest11`` entry point ``nemo_dist``. It adds

* options ``--dist-world-sizes=1,2,3,4`` (world sizes of ``dist_world`` tests),
  ``--dist-timeout=SECONDS`` (default deadline of one ``World.run``),
  ``--dist-require-gpu`` and ``--dist-max-gpus=N`` (see below);
* markers ``gpu`` (NCCL worlds on CUDA; skipped without enough GPUs) and
  ``world_sizes(*sizes)`` (restrict a test's world sizes);
* fixtures ``world_factory`` (session: ``(size, backend="gloo") -> World``,
  cached) and ``dist_world`` (a World, the test parametrized over sizes as
  ``w1``, ``w2``...);
* hypothesis profiles ``ci`` (default), ``dev``, ``thorough``.

Tests using ``dist_world`` are marked ``xdist_group`` per (backend, size), so
``pytest -n auto --dist loadgroup`` keeps each world in one xdist worker. This
module imports no torch at load time (only inside fixtures and GPU checks).

On a GPU host, ``--dist-require-gpu`` (or the environment variable
``NEMO_DIST_REQUIRE_GPU=1``) makes the run prove something: a ``gpu`` test
whose GPUs are missing fails, naming what is missing ("CUDA is not available
...", "an NCCL world of 4 needs 4 GPUs, 1 visible"), instead of skipping, and a
run that selected no ``gpu`` test at all exits non-zero (status 5) saying so.
``--dist-max-gpus=N`` bounds what is required: a ``gpu`` test whose NCCL world
needs more than N GPUs is skipped, naming the bound, even under
``--dist-require-gpu``; so a host with fewer GPUs than the largest world (one
H200) proves every world that fits it, and says which it left out.

``NEMO_DIST_FAKE_GPU_COUNT=N`` is a testing seam only: the plugin then takes N
as the number of visible GPUs (0: no CUDA), so the harness's own tests can
check the messages above on a CPU machine. It fakes nothing else; an NCCL
world still needs real GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from nemo_dist.testing import gpus, options, profiles

if TYPE_CHECKING:
    from nemo_dist.testing._world import World

__all__ = ["WorldFactory", "selected_world_sizes", "world_timeout"]

_DEFAULT_SIZES = "1,2,3,4"
_DEFAULT_TIMEOUT = "120"
_SIZES_KEY = pytest.StashKey[tuple[int, ...]]()
_TIMEOUT_KEY = pytest.StashKey[float]()
_REQUIRE_GPU_KEY = pytest.StashKey[bool]()
_MAX_GPUS_KEY = pytest.StashKey["int | None"]()
_PRELOAD_KEY = pytest.StashKey["tuple[str, ...]"]()
_GPU_TESTS_KEY = pytest.StashKey[int]()  # gpu tests selected (summed over xdist workers)
_NO_GPU_TEST_KEY = pytest.StashKey[str]()  # the message of a --dist-require-gpu run without gpu tests
_REQUIRE_GPU_ENV = "NEMO_DIST_REQUIRE_GPU"
_WORKER_GPU_TESTS = "nemo_dist_gpu_tests"  # key of a worker's count in xdist's workeroutput


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--dist-*`` options."""
    group = parser.getgroup("nemo_dist", "nemo_dist distributed worlds")
    group.addoption(
        "--dist-world-sizes",
        dest="dist_world_sizes",
        default=_DEFAULT_SIZES,
        metavar="SIZES",
        help=f"comma-separated world sizes that dist_world tests run in (default {_DEFAULT_SIZES})",
    )
    group.addoption(
        "--dist-timeout",
        dest="dist_timeout",
        default=_DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="default deadline of one World.run, after which hung ranks are "
        f"dumped and the world replaced (default {_DEFAULT_TIMEOUT})",
    )
    group.addoption(
        "--dist-require-gpu",
        dest="dist_require_gpu",
        action="store_true",
        default=False,
        help="fail (not skip) gpu tests whose CUDA or GPUs are missing, and fail a run that "
        f"selects no gpu test (also enabled by {_REQUIRE_GPU_ENV}=1)",
    )
    group.addoption(
        "--dist-max-gpus",
        dest="dist_max_gpus",
        default=None,
        metavar="N",
        help="use at most N GPUs: a gpu test whose NCCL world needs more is skipped, naming this bound, "
        "even under --dist-require-gpu (default: no bound)",
    )
    parser.addini(
        "dist_preload",
        type="linelist",
        default=[],
        help="modules the session's worlds import once, in the process their ranks are forked from, before any "
        "rank starts: each rank inherits them instead of importing them itself (a module that fails to import "
        "is left to the rank that needs it)",
    )


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        return options.parse_world_sizes(text)
    except options.BadOptionValue as exc:
        raise pytest.UsageError(
            "--dist-world-sizes expects a comma-separated list of world sizes "
            f">= 1, such as --dist-world-sizes=1,2,4; got {exc.text!r}"
        ) from None


def _parse_timeout(text: str) -> float:
    try:
        return options.parse_seconds(text)
    except options.BadOptionValue as exc:
        raise pytest.UsageError(
            f"--dist-timeout expects a number of seconds > 0, such as --dist-timeout=120; got {exc.value!r}"
        ) from None


def _parse_max_gpus(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return options.parse_positive_int(text)
    except options.BadOptionValue as exc:
        raise pytest.UsageError(
            f"--dist-max-gpus expects a number of GPUs >= 1, such as --dist-max-gpus=1; got {exc.value!r}"
        ) from None


def _require_gpu_from_env() -> bool:
    text = os.environ.get(_REQUIRE_GPU_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise pytest.UsageError(
            f"{_REQUIRE_GPU_ENV} expects 1 (fail gpu tests whose GPUs are missing, like "
            f"--dist-require-gpu) or 0; got {text!r}"
        )
    return text == "1"


def _load_profile(config: pytest.Config) -> None:
    try:
        from hypothesis import settings
        from hypothesis.errors import InvalidArgument
    except ImportError:  # pragma: no cover - hypothesis is a test extra
        return
    profiles.register_profiles()
    try:
        option = config.getoption("--hypothesis-profile")
    except ValueError:  # pragma: no cover - hypothesis plugin disabled
        option = None
    if option:
        return  # hypothesis's own plugin loads it
    name = os.environ.get("HYPOTHESIS_PROFILE") or profiles.DEFAULT_PROFILE
    try:
        settings.get_profile(name)  # check first: a failed load_profile leaves state behind
    except InvalidArgument:
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} is not a registered hypothesis profile; "
            f"use one of {', '.join(profiles.PROFILES)}"
        ) from None
    settings.load_profile(name)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Declare markers, validate options, choose the hypothesis profile."""
    config.addinivalue_line(
        "markers",
        "gpu: runs in NCCL worlds on CUDA; skipped without CUDA or enough GPUs (failed under --dist-require-gpu)",
    )
    config.addinivalue_line(
        "markers",
        "world_sizes(*sizes): restrict a dist_world test to these world sizes (intersected with --dist-world-sizes)",
    )
    config.stash[_SIZES_KEY] = _parse_sizes(config.getoption("dist_world_sizes"))
    config.stash[_TIMEOUT_KEY] = _parse_timeout(config.getoption("dist_timeout"))
    config.stash[_REQUIRE_GPU_KEY] = _require_gpu_from_env() or bool(config.getoption("dist_require_gpu"))
    config.stash[_MAX_GPUS_KEY] = _parse_max_gpus(config.getoption("dist_max_gpus"))
    config.stash[_PRELOAD_KEY] = tuple(config.getini("dist_preload"))
    if os.environ.get(gpus.FAKE_GPU_COUNT_ENV) is not None:
        _cuda_count()  # a malformed seam value stops the run here, not in a test
    _load_profile(config)


def _marker_sizes(marker: pytest.Mark, nodeid: str) -> set[int]:
    sizes = marker.args
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ValueError(
            f"{nodeid}: world_sizes expects one or more ints >= 1, such as "
            f"@pytest.mark.world_sizes(2, 4); got {sizes!r}"
        )
    return set(sizes)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``dist_world`` over the selected world sizes."""
    if "dist_world" not in metafunc.fixturenames:
        return
    definition = metafunc.definition
    sizes = metafunc.config.stash[_SIZES_KEY]
    marker = definition.get_closest_marker("world_sizes")
    if marker is not None:
        allowed = _marker_sizes(marker, definition.nodeid)
        selected = [s for s in sizes if s in allowed]
    else:
        allowed, selected = set(), list(sizes)
    backend = "nccl" if definition.get_closest_marker("gpu") else "gloo"
    if selected:
        metafunc.parametrize(
            "dist_world",
            [(s, backend) for s in selected],
            ids=[f"w{s}" for s in selected],
            indirect=True,
            scope="session",
        )
        return
    reason = (
        f"no world size left: world_sizes{tuple(sorted(allowed))} and "
        f"--dist-world-sizes={','.join(map(str, sizes))} do not intersect"
    )
    metafunc.parametrize(
        "dist_world",
        [pytest.param((0, backend), marks=pytest.mark.skip(reason=reason), id="w-none")],
        indirect=True,
        scope="session",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group ``dist_world`` tests per (backend, size) for ``--dist loadgroup``."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("dist_world") if callspec is not None else None
        if param is None:
            continue
        size, backend = param
        item.add_marker(pytest.mark.xdist_group(name=f"nemo_dist_{backend}_w{size}"))


def _cuda_count() -> int:
    """Visible GPUs (see :mod:`nemo_dist.testing.gpus`); a bad seam value is a usage error."""
    try:
        return gpus.visible_gpu_count()
    except options.BadOptionValue:
        raise pytest.UsageError(
            f"{gpus.FAKE_GPU_COUNT_ENV} (a testing seam: the number of GPUs the plugin takes as visible) "
            f"expects an int >= 0; got {os.environ.get(gpus.FAKE_GPU_COUNT_ENV)!r}"
        ) from None


def _missing_gpus(size: int | None = None) -> str | None:
    """What a gpu test (with an NCCL world of ``size``, if given) lacks here, or None."""
    _cuda_count()  # a bad seam value first, as a usage error
    return gpus.missing_gpus(size)


def _gpus_missing(missing: str, require_gpu: bool) -> None:
    """Skip the test for ``missing``, or fail it under --dist-require-gpu."""
    if require_gpu:
        pytest.fail(
            f"gpu test: {missing}; failed, not skipped, under --dist-require-gpu / {_REQUIRE_GPU_ENV}=1",
            pytrace=False,
        )
    pytest.skip(f"gpu test: {missing}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip ``gpu`` tests, with the reason, where CUDA is missing (fail them under --dist-require-gpu)."""
    if item.get_closest_marker("gpu") is None:
        return
    missing = _missing_gpus()
    if missing is not None:
        _gpus_missing(missing, item.config.stash[_REQUIRE_GPU_KEY])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Count the selected ``gpu`` tests (an xdist worker hands its count to the controller)."""
    count = sum(1 for item in session.items if item.get_closest_marker("gpu") is not None)
    session.config.stash[_GPU_TESTS_KEY] = count
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_WORKER_GPU_TESTS] = count


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: add up the workers' counts of selected ``gpu`` tests."""
    count = getattr(node, "workeroutput", {}).get(_WORKER_GPU_TESTS)
    if count is not None:
        stash = node.config.stash
        stash[_GPU_TESTS_KEY] = stash.get(_GPU_TESTS_KEY, 0) + count


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under --dist-require-gpu, a run that selected no ``gpu`` test exits non-zero."""
    config = session.config
    if not config.stash[_REQUIRE_GPU_KEY] or hasattr(config, "workeroutput"):
        return
    if config.stash.get(_GPU_TESTS_KEY, 0) > 0:
        return
    config.stash[_NO_GPU_TEST_KEY] = (
        f"--dist-require-gpu / {_REQUIRE_GPU_ENV}=1: no gpu test was selected, so this run proves "
        "nothing about GPUs; select gpu tests (such as -m gpu) or drop the switch"
    )
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say why a --dist-require-gpu run without gpu tests failed."""
    message = config.stash.get(_NO_GPU_TEST_KEY, None)
    if message is not None:
        terminalreporter.write_line(f"ERROR: {message}", red=True, bold=True)


def selected_world_sizes(config: pytest.Config) -> tuple[int, ...]:
    """The world sizes ``--dist-world-sizes`` selects (validated when pytest configured the plugin)."""
    return config.stash[_SIZES_KEY]


def world_timeout(config: pytest.Config) -> float:
    """The deadline of one ``World.run`` that ``--dist-timeout`` sets, in seconds."""
    return config.stash[_TIMEOUT_KEY]


class WorldFactory:
    """Session cache of Worlds: ``factory(size, backend="gloo") -> World``.

    A World is started once per (size, backend) and reused by every later
    call; :meth:`close` closes them all. For backend "nccl" the call skips the
    test when CUDA or ``size`` GPUs are missing (fails it with ``require_gpu``),
    and skips it when ``size`` is above ``max_gpus`` (whatever ``require_gpu``)
    once CUDA is there. Every World's ranks inherit the modules of ``preload``
    (the ini value ``dist_preload``), imported once before the first rank forks.
    """

    def __init__(
        self,
        timeout: float,
        *,
        require_gpu: bool = False,
        max_gpus: int | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        self._timeout = timeout
        self._preload = preload
        self._require_gpu = require_gpu
        self._max_gpus = max_gpus
        self._worlds: dict[tuple[int, str], World] = {}

    def __call__(self, size: int, backend: str = "gloo") -> World:
        """Return the session's World of ``size`` ranks on ``backend``."""
        from nemo_dist.testing._world import World

        if backend == "nccl":
            self._check_gpus(size)
        key = (size, backend)
        world = self._worlds.get(key)
        if world is None or world.closed:
            world = self._worlds[key] = World(size, backend, self._timeout, preload=self._preload)
        return world

    def _check_gpus(self, size: int) -> None:
        """Skip or fail the test when an NCCL world of ``size`` cannot or may not run here."""
        if _missing_gpus() is None and self._max_gpus is not None and size > self._max_gpus:
            pytest.skip(f"gpu test: an NCCL world of {size} needs {size} GPUs, above --dist-max-gpus={self._max_gpus}")
        missing = _missing_gpus(size)
        if missing is not None:
            _gpus_missing(missing, self._require_gpu)

    def close(self) -> None:
        """Close every World this factory started."""
        worlds, self._worlds = list(self._worlds.values()), {}
        for world in worlds:
            world.close()


@pytest.fixture(scope="session")
def world_factory(pytestconfig: pytest.Config) -> Iterator[WorldFactory]:
    """Session-wide ``(size, backend="gloo") -> World`` factory, closed at session end."""
    factory = WorldFactory(
        pytestconfig.stash[_TIMEOUT_KEY],
        require_gpu=pytestconfig.stash[_REQUIRE_GPU_KEY],
        max_gpus=pytestconfig.stash[_MAX_GPUS_KEY],
        preload=pytestconfig.stash[_PRELOAD_KEY],
    )
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def dist_world(request: pytest.FixtureRequest, world_factory: WorldFactory) -> World:
    """The persistent World of this test's parameter (``w2``: 2 gloo ranks).

    Backend "nccl" for tests marked ``gpu``, else "gloo".
    """
    param = getattr(request, "param", None)
    if param is None:
        raise pytest.UsageError(
            "dist_world is parametrized by the nemo_dist plugin; request it as a "
            "test argument, or use world_factory(size) elsewhere"
        )
    size, backend = param
    return world_factory(size, backend)
