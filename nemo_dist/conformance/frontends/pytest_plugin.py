"""The pytest front end: ``pytest conformance/ --conformance-gather MODULE ...``.

Loaded by the installed suite's conftest (``pytest --pyargs
nemo_dist.conformance.frontends.pytest_suite``), by ``conformance/conftest.py`` in a
clone, or with ``-p nemo_dist.conformance.frontends.pytest_plugin``; it loads the
harness plugin itself. Every registered check becomes one
test per world size of ``--dist-world-sizes`` (default 1,2,3,4), run in the
nemo_dist plugin's session worlds; a check that needs no process group is one
test, and a ddp check one test per entry point the module defines (the
registry's :func:`~nemo_dist.conformance.engine.registry.cases`, as the command runs
them). Its options are the command's, spelled ``--conformance-*``
(``--conformance-gather-fn MODULE:NAME`` for ``--gather-fn``), declared by
the one table both front ends read,
:data:`nemo_dist.conformance.engine.options.OPTIONS`; where the command has an
option of a run (``--world-sizes``, ``--seed``, ``-k`` ...), pytest or the
nemo_dist plugin has its own (the table's ``pytest_equivalent``).

A check the implementation does not support, or that does not apply to what
it did, is skipped with the reason; a failure shows hypothesis's shrunk
example, the likely cause and the line that re-runs it alone (node id,
options, ``--hypothesis-seed``); a step whose ranks are blocked past its
adaptive deadline fails as a hang at once (one still working gets time up to
``--dist-timeout``). Warnings raised inside a check are listed in pytest's warnings
summary, never failures (a fork's DeprecationWarning, say).
"""

from __future__ import annotations

import shlex
import warnings
from typing import TYPE_CHECKING, Any

import pytest

# Modules, not names: a module-level name beginning pytest_ would be taken for a hook of this plugin.
from nemo_dist.conformance.engine import option_spec, options

#: The harness plugin this front end runs its checks in (its worlds, ``--dist-*`` options): loaded with it.
pytest_plugins = ["nemo_dist.testing.plugin"]

if TYPE_CHECKING:
    from pathlib import Path

    from nemo_dist.conformance.engine.deadlines import Deadlines
    from nemo_dist.conformance.engine.implementation import Implementation
    from nemo_dist.testing.plugin import WorldFactory

__all__ = ["check_holds", "hypothesis_db", "implementation", "min_deadline", "option_name", "reproduce_line"]


def option_name(field: str) -> str:
    """This front end's option for an implementation field: ``gather_fn`` -> ``--conformance-gather-fn``."""
    return option_spec.pytest_name(field)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--conformance-*`` options: those of
    :data:`~nemo_dist.conformance.engine.options.OPTIONS` pytest declares."""
    group = parser.getgroup("conformance", "nemo_dist conformance of an implementation")
    for names, keywords in options.declarations(options.PYTEST):
        group.addoption(*names, **keywords)


def implementation(config: pytest.Config) -> tuple[Implementation, tuple[str, ...]]:
    """The ``Implementation`` the options name and the components to check.

    Named components are checked, the bundled modules serve the others; a
    preset names all four; naming nothing checks the bundled modules.
    Raises ``pytest.UsageError`` saying how to fix a bad option.
    """
    from nemo_dist.conformance.adapters.wrapping import check_mesh_world_sizes, wrapper_from_options
    from nemo_dist.conformance.engine.target import OptionError, implementation_from_options
    from nemo_dist.testing import options as values

    try:
        wrapper = wrapper_from_options(lambda field: config.getoption(option_name(field)))
        try:  # read here: the harness plugin may configure after this one (a bad value is its usage error)
            sizes = values.parse_world_sizes(config.getoption("dist_world_sizes"))
        except values.BadOptionValue:
            sizes = ()
        if sizes:
            check_mesh_world_sizes(wrapper, sizes, "--dist-world-sizes")
        impl, checked = implementation_from_options(
            lambda field: config.getoption(option_name(field)), {"ddp_wrapper": wrapper}
        )
    except OptionError as exc:
        raise pytest.UsageError(exc.worded(option_name)) from None
    return impl, checked


def hypothesis_db(config: pytest.Config) -> Path | None:
    """The directory ``--conformance-hypothesis-db`` names (default: the user's cache), or None for no database.

    Raises ``pytest.UsageError`` saying how to fix a bad value.
    """
    from nemo_dist.conformance.engine.profile import NO_DATABASE, resolve_hypothesis_db

    try:
        return resolve_hypothesis_db(config.getoption("--conformance-hypothesis-db"))
    except ValueError as exc:
        raise pytest.UsageError(
            f"--conformance-hypothesis-db {exc}, such as --conformance-hypothesis-db {NO_DATABASE}"
        ) from None


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options early, so a bad module is a usage error before collection."""
    from nemo_dist.conformance.engine.registry import TIERS

    if config.getoption("--conformance-tier") not in TIERS:
        raise pytest.UsageError(f"--conformance-tier expects one of {', '.join(TIERS)}")
    if config.getoption("--conformance-backend") not in ("gloo", "nccl"):
        raise pytest.UsageError("--conformance-backend expects gloo or nccl")
    hypothesis_db(config)
    implementation(config)
    min_deadline(config)


def min_deadline(config: pytest.Config) -> float:
    """The least per-step deadline ``--conformance-min-deadline`` sets (default ``FLOOR_S``), in seconds."""
    from nemo_dist.conformance.engine.deadlines import FLOOR_S
    from nemo_dist.testing.options import BadOptionValue, parse_seconds

    text = config.getoption("--conformance-min-deadline")
    if text is None:
        return FLOOR_S
    try:
        return parse_seconds(text)
    except BadOptionValue:
        raise pytest.UsageError(
            f"--conformance-min-deadline expects a number of seconds > 0, such as "
            f"--conformance-min-deadline=30; got {text!r}"
        ) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``conformance_case`` over the registry's cases that run (``gather.x-w2``, ``config.y``)."""
    if "conformance_case" not in metafunc.fixturenames:
        return
    from nemo_dist.conformance import load_checks
    from nemo_dist.conformance.engine.registry import cases, select_checks
    from nemo_dist.testing.plugin import selected_world_sizes

    config = metafunc.config
    impl, checked = implementation(config)
    checks = select_checks(load_checks().values(), impl, config.getoption("--conformance-tier"), None, checked)
    params = [
        pytest.param(case, id=case.name if case.world_size == 0 else f"{case.name}-w{case.world_size}")
        for case in cases(checks, impl, selected_world_sizes(config))
        if case.applies and case.impl is not None
    ]
    metafunc.parametrize("conformance_case", params)


@pytest.fixture(scope="session")
def conformance_impl(pytestconfig: pytest.Config) -> Implementation:
    """The implementation under test, as the ``--conformance-*`` options name it."""
    return implementation(pytestconfig)[0]


@pytest.fixture(scope="session")
def conformance_deadlines(pytestconfig: pytest.Config) -> Deadlines:
    """Adaptive step deadlines shared by the session, capped by ``--dist-timeout``."""
    from nemo_dist.conformance.engine.deadlines import Deadlines
    from nemo_dist.testing.plugin import world_timeout

    return Deadlines(world_timeout(pytestconfig), min_deadline(pytestconfig))


def reproduce_line(config: pytest.Config, nodeid: str, world_size: int, seed: int) -> str:
    """The pytest command that re-runs test ``nodeid`` alone: its conformance options, world size and seed.

    The options are those the table marks ``reproduce``, in table order, where they differ from their defaults.
    """
    parts = ["pytest", shlex.quote(nodeid)]
    for entry in options.repeated(options.PYTEST):
        parts += entry.reproduce_words(options.PYTEST, config.getoption(option_name(entry.dest)))
    if world_size:
        parts += [options.spelling("world_sizes", options.PYTEST), str(world_size)]
    return " ".join([*parts, f"{options.spelling('seed', options.PYTEST)}={seed}"])


def check_holds(
    case: Any, world_factory: WorldFactory, deadlines: Deadlines, config: pytest.Config, nodeid: str = ""
) -> None:
    """Run one registry case as a pytest test: pass, skip with the reason, or fail with example and cause.

    Hypothesis draws from one seed per test (``--hypothesis-seed`` when
    given, else a fresh one); with ``nodeid`` a failure ends with the line
    that re-runs this test alone with that seed.
    """
    from hypothesis import core

    from nemo_dist.conformance.engine.deadlines import DeadlineWorld, StepAborted, StepHung
    from nemo_dist.conformance.engine.errors import NotApplicable
    from nemo_dist.conformance.engine.explain import add_note, likely_cause
    from nemo_dist.conformance.engine.profile import hypothesis_settings, new_seed, seeded
    from nemo_dist.conformance.engine.registry import thoroughness
    from nemo_dist.conformance.engine.verdicts import classify, is_not_supported

    world: Any = None
    if case.world_size:
        world = DeadlineWorld(world_factory(case.world_size, config.getoption("--conformance-backend")), deadlines)
    seed = core.global_force_seed if isinstance(core.global_force_seed, int) else new_seed()
    reproduce = f"\nReproduce: {reproduce_line(config, nodeid, case.world_size, seed)}" if nodeid else ""
    # As in the command, warnings the implementation raises are notes (pytest's warnings summary), not failures.
    max_examples = config.getoption("--conformance-max-examples")
    with (
        warnings.catch_warnings(),
        hypothesis_settings(max_examples, database=hypothesis_db(config)),
        seeded(seed),
        thoroughness(case),
    ):
        warnings.simplefilter("default")
        try:
            case.check(world, case.impl)
        except NotApplicable as exc:
            pytest.skip(f"not applicable: {exc}")
        except StepHung as hung:
            pytest.fail(f"HANG: {hung.deadline_note}\nHung step: {hung.call}\n{hung}{reproduce}", pytrace=False)
        except StepAborted as broke:
            text = f"Failing step (not shrunk: it left ranks stuck or dead): {broke.call}\n{broke}{reproduce}"
            pytest.fail(text, pytrace=False)
        except Exception as exc:
            if is_not_supported(exc):  # the reason, also when every rank raised it
                pytest.skip(f"not supported: {classify(exc).message.removeprefix('NotSupported: ')}")
            cause = likely_cause(exc) or _missing_parameter_cause(case.impl, exc)
            if not cause and config.getoption("--conformance-backend") == "gloo":
                cause = _cuda_cause(case.impl, exc)
            if cause:
                add_note(exc, f"Likely cause: {cause}")
            if reproduce:
                add_note(exc, reproduce.strip())
            raise


def _missing_parameter_cause(impl: Implementation | None, exc: BaseException) -> str:
    """For a callable whose hidden signature lacked a parameter in the call: which, and the option to fill it."""
    from nemo_dist.conformance.adapters.signature import missing_in_text

    if impl is None or impl.gather_fn is None:
        return ""
    names = missing_in_text(str(exc))
    if not names:
        return ""
    return (
        f"{impl.gather_fn} was called without its required parameter {names[0]!r}; pass it on every call "
        f"with {option_name('gather_kwarg')} {names[0]}=VALUE"
    )


def _cuda_cause(impl: Implementation | None, exc: BaseException) -> str:
    """For a callable whose failure says it needs a GPU (in a gloo, CPU, run): the evidence and the option to use.

    The evidence is :func:`~nemo_dist.conformance.engine.needs_gpu.gpu_need`'s (the
    ranks' errors read as text: a raising or ``assert`` line, an error line,
    a torch.cuda frame); "" without a gather callable or without evidence.
    """
    from nemo_dist.conformance.engine.needs_gpu import gpu_need

    if impl is None or impl.gather_fn is None:
        return ""
    evidence = gpu_need(exc)
    if not evidence:
        return ""
    return (
        f"{impl.gather_fn} needs CUDA (its error says so: {evidence}); run it on GPUs with --conformance-backend nccl"
    )
