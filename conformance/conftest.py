"""pytest options of the conformance suite: ``pytest conformance/ --conformance-gather MODULE ...``.

Every registered check becomes one test per world size (``--dist-world-sizes``,
default 1,2,3,4), run in the nemo_dist plugin's session worlds. Options:
``--conformance-gather/-ddp/-config MODULE`` (naming any checks only those
components; naming none checks the bundled ones), ``--conformance-preset``,
``--conformance-tier`` (core, extended, all), ``--conformance-max-examples``
and ``--conformance-backend`` (gloo, nccl).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from nemo_dist.conformance import Implementation

_COMPONENTS: tuple[str, ...] = ("gather", "ddp", "config")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--conformance-*`` options."""
    group = parser.getgroup("conformance", "nemo_dist conformance of an implementation")
    for component, names in (
        ("gather", "all_gather_with_grad and all_gather_no_grad"),
        ("ddp", "DDPManager"),
        ("config", "DDPConfig"),
    ):
        group.addoption(f"--conformance-{component}", metavar="MODULE", help=f"module with {names}")
    group.addoption("--conformance-preset", metavar="NAME", help="named module layout (nemo_dist, nemo_automodel)")
    group.addoption("--conformance-tier", default="all", help="core, extended or all (default all)")
    group.addoption(
        "--conformance-max-examples",
        type=int,
        default=None,
        metavar="N",
        help="hypothesis examples per check (default: the active hypothesis profile's)",
    )
    group.addoption("--conformance-backend", default="gloo", help="gloo or nccl (default gloo)")


def implementation(config: pytest.Config) -> tuple[Implementation, tuple[str, ...]]:
    """The ``Implementation`` the options name and the components to check.

    Named components are checked, the bundled modules serve the others; a
    preset names all three; naming nothing checks the bundled modules.
    Raises ``pytest.UsageError`` saying how to fix a bad option.
    """
    from nemo_dist.conformance import PRESETS, REFERENCE, Implementation

    named = {c: config.getoption(f"--conformance-{c}") for c in _COMPONENTS}
    named = {c: path for c, path in named.items() if path}
    preset = config.getoption("--conformance-preset")
    if preset is not None:
        if preset not in PRESETS:
            raise pytest.UsageError(
                f"--conformance-preset {preset!r} is unknown; use one of {', '.join(PRESETS)}"
            )
        base = PRESETS[preset]
        impl, checked = Implementation(**{c: named.get(c, getattr(base, c)) for c in _COMPONENTS}), _COMPONENTS
    elif named:
        impl = Implementation(**{c: named.get(c, getattr(REFERENCE, c)) for c in _COMPONENTS})
        checked = tuple(c for c in _COMPONENTS if c in named)
    else:
        impl, checked = REFERENCE, _COMPONENTS
    for component in _COMPONENTS:
        path = getattr(impl, component)
        if path is None:
            continue
        try:
            importlib.import_module(path)
        except Exception as exc:
            raise pytest.UsageError(
                f"--conformance-{component} module {path!r} does not import: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    return impl, checked


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options early, so a bad module is a usage error before collection."""
    from nemo_dist.conformance import TIERS

    if config.getoption("--conformance-tier") not in TIERS:
        raise pytest.UsageError(f"--conformance-tier expects one of {', '.join(TIERS)}")
    if config.getoption("--conformance-backend") not in ("gloo", "nccl"):
        raise pytest.UsageError("--conformance-backend expects gloo or nccl")
    implementation(config)


def _sizes(config: pytest.Config) -> list[int]:
    return [int(s) for s in str(config.getoption("dist_world_sizes")).split(",")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``conformance_case`` over selected checks x world sizes (``gather.x-w2``)."""
    if "conformance_case" not in metafunc.fixturenames:
        return
    from nemo_dist.conformance import load_checks, select_checks

    config = metafunc.config
    impl, checked = implementation(config)
    checks = select_checks(load_checks().values(), impl, config.getoption("--conformance-tier"), None, checked)
    cases = [
        pytest.param((c.name, size), id=f"{c.name}-w{size}")
        for c in checks
        for size in _sizes(config)
        if c.applies_to(size)
    ]
    metafunc.parametrize("conformance_case", cases)


@pytest.fixture(scope="session")
def conformance_impl(pytestconfig: pytest.Config) -> Implementation:
    """The implementation under test, as the ``--conformance-*`` options name it."""
    return implementation(pytestconfig)[0]
