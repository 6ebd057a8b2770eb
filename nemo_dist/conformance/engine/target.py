"""Which implementation a check runs against: options resolved into an :class:`Implementation`, and validated.

Every component is a suite's, declared as a
:class:`~nemo_dist.conformance.engine.declarations.SuiteTarget`: its fields,
defaults, presets, module and hooks. :func:`resolve_implementation` turns
option values into an implementation and the components to check, and
:func:`validate_implementation` imports what it names, so the command and
``pytest conformance/`` agree on both. Their errors name options by field;
each front end words them in its own option names
(:meth:`OptionError.worded`). Nothing here names a component: what differs
between them is in their declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_dist.conformance.engine.declarations import SuiteTarget, suite_targets
from nemo_dist.conformance.engine.errors import MissingParameter, NotApplicable, NotSupported, OptionError
from nemo_dist.conformance.engine.implementation import Implementation, declared_fields
from nemo_dist.conformance.engine.importing import import_path, resolve_callable
from nemo_dist.conformance.engine.options import BY_FIELD

__all__ = [
    "COMPONENTS",
    "IMPLEMENTATION_OPTION_FIELDS",
    "PRESETS",
    "REFERENCE",
    "STANDALONE",
    "SUITE_TARGETS",
    "Implementation",
    "MissingParameter",
    "NotApplicable",
    "NotSupported",
    "OptionError",
    "checked_components",
    "implementation_from_options",
    "import_components",
    "own_modules",
    "resolve_callable",
    "resolve_implementation",
    "validate_implementation",
    "variants_of",
]

#: Every component, by name, as its suite declares it (:mod:`~nemo_dist.conformance.engine.declarations`).
SUITE_TARGETS: dict[str, SuiteTarget] = {target.component: target for target in suite_targets()}
#: The components an implementation can name, in the order checks and reports list them (the suites' order).
COMPONENTS: tuple[str, ...] = tuple(SUITE_TARGETS)
#: Components whose module serves no other component's checks: imported and named only when checked themselves.
STANDALONE: frozenset[str] = frozenset(c for c, t in SUITE_TARGETS.items() if t.standalone)
#: The options naming what is checked, as :func:`implementation_from_options` reads them (their table fields).
IMPLEMENTATION_OPTION_FIELDS: tuple[str, ...] = (
    "preset",
    *dict.fromkeys(f for t in SUITE_TARGETS.values() for f in t.option_fields if f in BY_FIELD),
)
#: The components whose module an implementation holds unless named otherwise (the preset error names them).
_DEFAULTED = tuple(t for t in SUITE_TARGETS.values() if t.module_field in t.defaults)
#: Every keyword :func:`resolve_implementation` takes besides ``preset`` and ``suite_options``.
_KEYWORDS = frozenset(f for t in SUITE_TARGETS.values() for f in (*t.fields, *t.settings, *t.options))


def resolve_implementation(
    *, preset: str | None = None, suite_options: Mapping[str, Any] | None = None, **fields: Any
) -> tuple[Implementation, tuple[str, ...]]:
    """The implementation the options name and the components to check.

    ``fields`` (and ``suite_options``, the same as a mapping) are option
    values by field, None or empty where not given: ``gather="my.fork"``,
    ``gather_fn="m:f"``, ``tp_plan=...``. A component is checked when any of
    its fields is given. A preset names every component's modules (the given
    values override it); otherwise the named components are checked and the
    bundled modules serve the others (a DDP check needs a config class);
    naming nothing checks the bundled implementation. Each suite's ``resolve``
    turns its given options into the fields it holds and raises
    ``OptionError`` for a bad combination. Nothing is imported but those hooks.
    """
    unknown = sorted(set(fields) - _KEYWORDS)
    if unknown:
        raise TypeError(f"resolve_implementation() got unexpected keyword arguments {', '.join(unknown)}")
    given = _given({**(suite_options or {}), **fields})
    held: dict[str, Any] = {}
    named: list[str] = []
    for target in SUITE_TARGETS.values():
        own = {f: v for f, v in given.items() if f in target.option_fields}
        held.update(resolve_callable(target.resolve)(own) if target.resolve else own)
        if any(f in given for f in target.fields):
            named.append(target.component)
    companions = _companions(held)
    if preset is not None:
        if preset not in PRESETS:
            modules = "/".join(f"{{opt:{t.module_field}}}" for t in _DEFAULTED)
            raise OptionError(
                f"unknown {{opt:preset}} {preset!r}; choose one of {', '.join(PRESETS)}, "
                f"or name the modules with {modules}"
            )
        impl = _preset_implementation(preset).replaced(**held)
        return impl, (*(c for c in checked_components(impl) if c not in companions), *companions)
    if not named:
        return REFERENCE, COMPONENTS
    for target in SUITE_TARGETS.values():
        if target.component in named and target.subject_fields and not any(f in held for f in target.subject_fields):
            held.update({f: v for f, v in target.reference.items() if f in target.subject_fields})
    return Implementation(suite_options=held.items()), (*(c for c in COMPONENTS if c in named), *companions)


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options that were given (not None, not False, not an empty list), a repeatable one's list as a tuple."""
    given: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value is False or (isinstance(value, (list, tuple)) and not value):
            continue
        given[name] = tuple(str(v) for v in value) if isinstance(value, list) else value
    return given


def _companions(held: Mapping[str, Any]) -> tuple[str, ...]:
    """The companion components whose field holds a value in ``held`` (the ``--ddp-fn`` wrapper's checks)."""
    return tuple(c for t in SUITE_TARGETS.values() for c, f in t.companions.items() if held.get(f) is not None)


def implementation_from_options(
    value: Callable[[str], Any], built: Mapping[str, Any] | None = None
) -> tuple[Implementation, tuple[str, ...]]:
    """:func:`resolve_implementation` of a front end's options, then :func:`validate_implementation` of what it gives.

    ``value(field)`` reads each of :data:`IMPLEMENTATION_OPTION_FIELDS` (None, or
    an empty list for a repeatable option, when not given); ``built`` are
    fields a front end built from options itself (the ``--ddp-fn`` wrapper,
    ``wrapping.wrapper_from_options``). Raises ``OptionError``, which each front
    end words in its own spelling.
    """
    given = {field: value(field) for field in IMPLEMENTATION_OPTION_FIELDS if field != "preset"}
    impl, components = resolve_implementation(preset=value("preset"), **given, **(built or {}))
    validate_implementation(impl, components)
    return impl, components


def validate_implementation(impl: Implementation, components: Sequence[str] = COMPONENTS) -> None:
    """Import every module and callable ``impl`` names and check the names each must define.

    A :data:`STANDALONE` component's module serves no other component, so it
    is imported only when ``components`` (those checked) include it:
    importing torch's FSDP2 costs about a second. A checked component's own
    ``validate`` runs after its module's names are checked. Raises
    ``OptionError`` naming the option, the module and the remedy.
    """
    for target in SUITE_TARGETS.values():
        checked = target.component in components
        if target.module_field and impl.value(target.module_field) is not None and (checked or not target.standalone):
            _validate_module(target, impl.value(target.module_field))
        if checked and target.validate is not None:
            resolve_callable(target.validate)(impl)


def _validate_module(target: SuiteTarget, path: str) -> None:
    """Import a component's module and check that it defines its ``required`` names (and one ``required_any``)."""
    try:
        module = import_path(path)
    except OptionError as exc:
        raise OptionError(f"{{opt:{target.module_field}}} module {path!r} does not import: {exc.template}") from None
    must = f"a {target.component} module must define {''.join(f'{n} and ' for n in target.required)}"
    if target.required_any and not any(hasattr(module, n) for n in target.required_any):
        names = " nor ".join(target.required_any)
        raise OptionError(
            f"{{opt:{target.module_field}}} module {path!r} has neither {names}; {must}at least one of them"
        )
    missing = [n for n in target.required if not hasattr(module, n)]
    if missing:
        raise OptionError(
            f"{{opt:{target.module_field}}} module {path!r} has no {', '.join(missing)}; "
            f"a {target.component} module must define {', '.join(target.required)}"
        )


def _preset(target: SuiteTarget, name: str) -> Mapping[str, Any]:
    """What ``target`` holds under ``--preset name`` (its reference under the bundled preset unless it says)."""
    return target.presets.get(name, target.reference if name == "nemo_dist" else {})


#: The bundled implementation: what each suite declares as its reference.
REFERENCE = Implementation(suite_options=[(f, v) for t in SUITE_TARGETS.values() for f, v in t.reference.items()])

def _preset_implementation(name: str) -> Implementation:
    """The implementation ``--preset name`` names: what every suite declares for it."""
    return Implementation(suite_options=[(f, v) for t in SUITE_TARGETS.values() for f, v in _preset(t, name).items()])


#: Named module layouts, for ``--preset``: the bundled one, and each layout the suites declare presets for.
PRESETS: dict[str, Implementation] = {
    name: _preset_implementation(name)
    for name in ("nemo_dist", *dict.fromkeys(n for t in SUITE_TARGETS.values() for n in t.presets))
}


def import_components(impl: Implementation, components: Sequence[str] = COMPONENTS) -> None:
    """Import every module ``impl`` names (run on each rank before its checks: imports cost seconds).

    A :data:`STANDALONE` component's module only where ``components`` (those
    whose checks run) include it.
    """
    for target in SUITE_TARGETS.values():
        used = not target.standalone or target.component in components
        if used and target.module_field and impl.value(target.module_field) is not None:
            impl.module(target.module_field)


def own_modules(impl: Implementation) -> tuple[str, ...]:
    """The modules of this package that ``impl``'s fields name (a module, or the module of a ``module:name``).

    These are the bundled components a run checks unless told otherwise. They import only torch and the standard
    library, start no thread and touch no accelerator when imported, so the ranks' fork server may import them
    before it forks (:func:`~nemo_dist.conformance.engine.runner.run_checks`); a user's module may do any of
    these, so it is imported by each rank.
    """
    package = __name__.split(".")[0] + "."
    named = []
    for field in (*declared_fields(), *(f for f, _ in impl.suite_options)):
        values = impl.value(field)
        for value in values if isinstance(values, tuple) else (values,):
            if isinstance(value, str) and value.startswith(package):
                named.append(value.partition(":")[0])
    return tuple(dict.fromkeys(named))


def checked_components(impl: Implementation) -> tuple[str, ...]:
    """The components ``impl`` names (any of their fields holds a value), in :data:`COMPONENTS` order, then the
    companions whose field holds one (a ``--ddp-fn`` wrapper's checks)."""
    named = tuple(c for c, t in SUITE_TARGETS.items() if any(impl.value(f) is not None for f in t.fields))
    fields = {f for t in SUITE_TARGETS.values() for f in t.companions.values()}
    return (*named, *_companions({f: impl.value(f) for f in fields}))


def variants_of(component: str, impl: Implementation) -> tuple[str, ...] | None:
    """The variants (entry points) of ``component`` that ``impl`` has, each checked on its own; None: one run.

    The pinned one alone when its ``variant_field`` holds one; else those of
    its ``variant_names`` its module defines; None where the component has
    no variants or no module is named (a ``--ddp-fn`` wrapper replaces it).
    """
    target = SUITE_TARGETS.get(component)
    if target is None or not target.variant_names or target.module_field is None:
        return None
    pinned = impl.value(target.variant_field) if target.variant_field else None
    if pinned is not None:
        return (pinned,)
    if impl.value(target.module_field) is None:
        return None
    module = impl.module(target.module_field)
    return tuple(name for name in target.variant_names if hasattr(module, name))
