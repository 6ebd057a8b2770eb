"""What the suites declare to the engine: the only way the engine learns of a suite.

A suite is a folder of ``nemo_dist/conformance/suites/`` (:data:`SUITES_FOLDER`): its ``__init__.py``
registers its checks when imported (:func:`nemo_dist.conformance.load_checks` imports every one, in
:data:`SUITE_PACKAGES` order), and its ``options.py``, standard library only, declares

- ``ORDER``: an integer, where its checks stand in the run and its options in the table (lower first);
- ``OPTIONS``: its front-end options (:class:`~nemo_dist.conformance.engine.option_spec.Option`
  entries), which join the one option table (:mod:`nemo_dist.conformance.engine.options`);
- ``TABLES``: README option tables of its own (marker name -> the header of
  their second column), which its options' docs fill;
- ``TARGET``: a :class:`SuiteTarget`, the component the suite checks and how
  its options name it: the engine then resolves, validates, imports, labels and
  presets that component, with no edit to the engine.

Adding a suite is adding its folder. The options modules are loaded by file,
without importing their packages (which import torch), so the option table
stays importable without torch.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "SUITES_FOLDER",
    "SUITE_PACKAGES",
    "SuiteTarget",
    "suite_option_modules",
    "suite_options",
    "suite_packages",
    "suite_tables",
    "suite_targets",
]

SUITE_PACKAGES: tuple[str, ...]  # the suites' packages in order (:func:`suite_packages`), read on first use

#: The folder every suite is a package of: ``suites/NAME/`` with ``__init__.py`` (its checks) and ``options.py``.
SUITES_FOLDER = Path(__file__).resolve().parents[1] / "suites"
_SUITES_PACKAGE = "nemo_dist.conformance.suites"


@dataclass(frozen=True)
class SuiteTarget:
    """A component a suite checks, named by the suite's own options: how the engine resolves, validates, imports,
    labels and presets it, with no code of the engine naming it.

    ``component`` is the name checks register under and reports show.
    ``fields`` are the fields of an :class:`~nemo_dist.conformance.engine.implementation.Implementation` whose
    values say what is checked: the component is checked when any of them holds a value. ``settings`` are
    further fields it reads that name nothing (how a callable is called, a pinned entry point); ``defaults``
    what an implementation holds for a field of either kind not given (the bundled module of a component
    checked unless named otherwise, a setting's default). ``options`` are the option fields its ``resolve``
    reads where they are not fields themselves (``gather_kwarg``, parsed into ``gather_kwargs``).

    ``module_field`` is the field of the one module the component's contract lives in, if any (imported on each
    rank before the checks); it must define every name of ``required`` and, where ``required_any`` is given, at
    least one of those. ``standalone``: the module serves no other component's checks, so it is imported and
    named only when its own checks run (False: a DDP check needs the config module too).

    ``reference`` is what the bundled run checks (field -> value), ``presets`` the same per ``--preset`` name.
    ``label_fields`` are the fields a report's header names the component by, the first one holding a value;
    ``label`` (``"module:function"``, ``function(impl) -> str | None``) replaces them where a label is built.
    ``resolve`` (``"module:function"``, ``function(given) -> dict``) turns the options given (field -> value,
    those not given left out) into the fields the implementation holds, and raises ``OptionError`` for a bad
    combination; without it the given fields are held as they are. ``validate`` (``"module:function"``, called
    as ``function(impl)`` in the parent before any world starts, when the component is checked) imports what
    the fields name and raises ``OptionError`` naming the option at fault. ``subject_fields`` name what is
    checked (a module, a callable): a run that names the component by its other fields only (a model to check
    on, say) checks the reference's subject.

    ``variant_names`` are entry points a module may define, each checked on its own (a check named
    ``check[name]``, the implementation's ``variant_field`` pinned to it); a check runs once per variant the
    module defines, once where no module is named. ``companions`` are components whose checks run too, after
    every other's, while a field holds a value (component -> field).
    """

    component: str
    fields: tuple[str, ...]
    settings: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    module_field: str | None = None
    required: tuple[str, ...] = ()
    required_any: tuple[str, ...] = ()
    standalone: bool = True
    reference: Mapping[str, Any] = field(default_factory=dict)
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    label_fields: tuple[str, ...] = ()
    label: str | None = None
    resolve: str | None = None
    validate: str | None = None
    subject_fields: tuple[str, ...] = ()
    variant_names: tuple[str, ...] = ()
    variant_field: str | None = None
    companions: Mapping[str, str] = field(default_factory=dict)

    @property
    def option_fields(self) -> tuple[str, ...]:
        """The option fields that :func:`~nemo_dist.conformance.engine.target.implementation_from_options` reads
        for this component: its fields, its settings and the options its ``resolve`` reads."""
        return tuple(dict.fromkeys((*self.fields, *self.settings, *self.options)))


_LOADED: list[ModuleType] | None = None


def suite_option_modules() -> list[ModuleType]:
    """The ``options`` module of every suite, in the order their ``ORDER`` says, each loaded by file once.

    A suite is a folder of :data:`SUITES_FOLDER` with an ``__init__.py`` and an ``options.py``; its options
    module is loaded without importing its package (which imports torch). A folder without ``options.py`` is
    no suite.
    """
    global _LOADED
    if _LOADED is None:
        found = []
        for folder in sorted(SUITES_FOLDER.iterdir()):
            path = folder / "options.py"
            if not (folder / "__init__.py").is_file() or not path.is_file():
                continue
            found.append(_loaded(f"{_SUITES_PACKAGE}.{folder.name}.options", path))
        _LOADED = sorted(found, key=lambda module: module.ORDER)
    return _LOADED


def _loaded(name: str, path: Path) -> ModuleType:
    """The module ``name`` from ``path``: the one already imported, else loaded by file and entered as ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the package's own later import finds this one, not a second copy
    spec.loader.exec_module(module)
    return module


def suite_packages() -> tuple[str, ...]:
    """The suites' packages, in the order their checks are listed: importing one registers its checks."""
    return tuple(module.__name__.rsplit(".", 1)[0] for module in suite_option_modules())


def __getattr__(name: str) -> Any:
    """:data:`SUITE_PACKAGES`, found on first use (the suites folder read then)."""
    if name == "SUITE_PACKAGES":
        return suite_packages()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def suite_options() -> tuple[Any, ...]:
    """Every suite's declared options, in :data:`SUITE_PACKAGES` order."""
    return tuple(entry for module in suite_option_modules() for entry in getattr(module, "OPTIONS", ()))


def suite_targets() -> tuple[SuiteTarget, ...]:
    """Every suite's declared :class:`SuiteTarget`, in :data:`SUITE_PACKAGES` order."""
    return tuple(module.TARGET for module in suite_option_modules() if getattr(module, "TARGET", None) is not None)


def suite_tables() -> dict[str, str]:
    """Every suite's README option tables (marker name -> second column's header), in :data:`SUITE_PACKAGES` order."""
    return {name: header for module in suite_option_modules() for name, header in getattr(module, "TABLES", {}).items()}
