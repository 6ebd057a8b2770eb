"""The suites the engine runs, and what a suite that owns a component of its own declares to the engine.

:data:`SUITE_PACKAGES` lists the suites whose import registers their checks
(:func:`nemo_dist.conformance.load_checks`). A suite package may also hold an
``options`` module, standard library only, that declares

- ``OPTIONS``: its front-end options (:class:`~nemo_dist.conformance.engine.option_spec.Option`
  entries), which join the one option table (:mod:`nemo_dist.conformance.engine.options`);
- ``TABLES``: README option tables of its own (marker name -> the header of
  their second column), which its options' docs fill;
- ``TARGET``: a :class:`SuiteTarget`, the component the suite checks and how
  its options name it: the engine then resolves, validates, imports, labels and
  presets that component as it does its own, with no edit to the engine.

The options modules are loaded by file, without importing their packages
(which import torch), so the option table stays importable without torch.
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
    "SUITE_PACKAGES",
    "SuiteTarget",
    "suite_option_modules",
    "suite_options",
    "suite_tables",
    "suite_targets",
]

#: The suites whose import registers the bundled checks, in the order their checks are listed.
SUITE_PACKAGES: tuple[str, ...] = (
    "nemo_dist.conformance.suites.gather",
    "nemo_dist.conformance.suites.ddp",
    "nemo_dist.conformance.suites.config",
    "nemo_dist.conformance.suites.real_models",
    "nemo_dist.conformance.suites.wrapper",
    "nemo_dist.conformance.suites.fsdp2",
    "nemo_dist.conformance.suites.tp",
    "nemo_dist.conformance.suites.a2a",
    "nemo_dist.conformance.suites.moe",
    "nemo_dist.conformance.suites.pp",
)


@dataclass(frozen=True)
class SuiteTarget:
    """A component a suite checks, named by the suite's own options.

    ``component`` is the name checks register under and reports show;
    ``fields`` the option fields (``tp_plan``) whose values say what is
    checked: the component is checked when any of them is given. ``module_field``
    is the field of the one module the component's contract lives in, if any
    (imported on each rank before the checks, and required to define
    ``required``). ``reference`` is what the bundled run checks (field ->
    value), ``presets`` the same per ``--preset`` name. ``label_fields`` are
    the fields a report's header names the component by, the first one given.
    ``validate`` (``"module:function"``, called as ``function(impl)`` in the
    parent before any world starts) imports what the fields name and raises
    ``OptionError`` naming the option at fault. ``repeatable`` fields hold a
    tuple of texts. ``subject_fields`` name what is checked (a module, a
    callable): a run that names the component by its other fields only
    (a model to check on, say) checks the reference's subject.
    """

    component: str
    fields: tuple[str, ...]
    module_field: str | None = None
    required: tuple[str, ...] = ()
    reference: Mapping[str, Any] = field(default_factory=dict)
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    label_fields: tuple[str, ...] = ()
    validate: str | None = None
    repeatable: tuple[str, ...] = ()
    subject_fields: tuple[str, ...] = ()


_LOADED: list[ModuleType] | None = None


def suite_option_modules() -> list[ModuleType]:
    """The ``options`` module of each suite package that has one, loaded by file once (packages not imported)."""
    global _LOADED
    if _LOADED is None:
        found = []
        root = Path(__file__).parents[3]  # the directory holding the nemo_dist package
        for package in SUITE_PACKAGES:
            name = f"{package}.options"
            if name in sys.modules:
                found.append(sys.modules[name])
                continue
            path = root.joinpath(*package.split("."), "options.py")
            if not path.is_file():
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # the package's own later import finds this one, not a second copy
            spec.loader.exec_module(module)
            found.append(module)
        _LOADED = found
    return _LOADED


def suite_options() -> tuple[Any, ...]:
    """Every suite's declared options, in :data:`SUITE_PACKAGES` order."""
    return tuple(entry for module in suite_option_modules() for entry in getattr(module, "OPTIONS", ()))


def suite_targets() -> tuple[SuiteTarget, ...]:
    """Every suite's declared :class:`SuiteTarget`, in :data:`SUITE_PACKAGES` order."""
    return tuple(module.TARGET for module in suite_option_modules() if getattr(module, "TARGET", None) is not None)


def suite_tables() -> dict[str, str]:
    """Every suite's README option tables (marker name -> second column's header), in :data:`SUITE_PACKAGES` order."""
    return {name: header for module in suite_option_modules() for name, header in getattr(module, "TABLES", {}).items()}
