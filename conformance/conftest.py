"""pytest options of the conformance suite: ``pytest conformance/ --conformance-gather MODULE ...``.

Every registered check becomes one test per world size (``--dist-world-sizes``,
default 1,2,3,4), run in the nemo_dist plugin's session worlds; a check that
needs no process group is one test, and a ddp check one test per entry point
the module defines. Options: ``--conformance-gather/-ddp/-config MODULE``
(naming any checks only those components; naming none checks the bundled
ones), ``--conformance-gather-fn MODULE:NAME`` (one all-gather callable, with
``--conformance-no-grad-fn`` and ``--conformance-gather-form``),
``--conformance-preset``, ``--conformance-tier`` (core, extended, all),
``--conformance-max-examples`` and ``--conformance-backend`` (gloo, nccl).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from nemo_dist.conformance import Implementation

_OPTION_NAMES = re.compile(r"--(gather-fn|no-grad-fn|gather-form|gather|ddp|config|preset)\b")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--conformance-*`` options."""
    group = parser.getgroup("conformance", "nemo_dist conformance of an implementation")
    for component, names in (
        ("gather", "all_gather_with_grad and all_gather_no_grad"),
        ("ddp", "DDPManager"),
        ("config", "DDPConfig"),
    ):
        group.addoption(f"--conformance-{component}", metavar="MODULE", help=f"module with {names}")
    group.addoption(
        "--conformance-gather-fn",
        metavar="MODULE:NAME",
        help="one all-gather callable (function or autograd Function) instead of a gather module",
    )
    group.addoption(
        "--conformance-no-grad-fn", metavar="MODULE:NAME", help="the no-grad counterpart of --conformance-gather-fn"
    )
    group.addoption(
        "--conformance-gather-form", default="auto", help="output form of the callable: auto, cat, tuple, stacked"
    )
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
    from nemo_dist.conformance import OptionError, resolve_implementation, validate_implementation

    try:
        impl, checked = resolve_implementation(
            gather=config.getoption("--conformance-gather"),
            ddp=config.getoption("--conformance-ddp"),
            config=config.getoption("--conformance-config"),
            preset=config.getoption("--conformance-preset"),
            gather_fn=config.getoption("--conformance-gather-fn"),
            no_grad_fn=config.getoption("--conformance-no-grad-fn"),
            gather_form=config.getoption("--conformance-gather-form"),
        )
        validate_implementation(impl)
    except OptionError as exc:
        # The messages name the command's options; here they are --conformance-*.
        raise pytest.UsageError(_OPTION_NAMES.sub(r"--conformance-\1", str(exc))) from None
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
    """Parametrize ``conformance_case`` over selected check runs x world sizes (``gather.x-w2``, ``config.y``)."""
    if "conformance_case" not in metafunc.fixturenames:
        return
    from nemo_dist.conformance import load_checks, select_checks

    config = metafunc.config
    impl, checked = implementation(config)
    checks = select_checks(load_checks().values(), impl, config.getoption("--conformance-tier"), None, checked)
    cases = []
    for c in checks:
        for name, variant in c.variants(impl):
            if not c.needs_world:
                cases.append(pytest.param((c.name, variant, 0), id=name))
                continue
            cases += [
                pytest.param((c.name, variant, size), id=f"{name}-w{size}")
                for size in _sizes(config)
                if c.applies_to(size)
            ]
    metafunc.parametrize("conformance_case", cases)


@pytest.fixture(scope="session")
def conformance_impl(pytestconfig: pytest.Config) -> Implementation:
    """The implementation under test, as the ``--conformance-*`` options name it."""
    return implementation(pytestconfig)[0]
