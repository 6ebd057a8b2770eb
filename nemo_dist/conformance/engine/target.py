"""Which implementation a check runs against: options resolved into an :class:`Implementation`, and validated.

An :class:`~nemo_dist.conformance.engine.implementation.Implementation` names
modules (``gather``, ``ddp``, ``config``) or, for the gather component, one
callable found anywhere (``gather_fn``, a ``module:name``). Only these
strings travel to the ranks; each rank imports them itself.
:func:`resolve_implementation` turns command-line style options into an
implementation and :func:`validate_implementation` imports what it names, so
the command and ``pytest conformance/`` agree on both. Their errors name
options by field; each front end words them in its own option names
(:meth:`OptionError.worded`).

This is the top of the engine's lower layers: it imports :mod:`.callables`
and :mod:`.wrapping` (how a gather callable and a ``--ddp-fn`` wrapper are
called and checked), and they import nothing from here. It re-exports, for
the modules above it, the names that live below it: ``Implementation``,
``DDP_APIS`` and ``GROUP_PARAMETERS`` (:mod:`.implementation`),
``resolve_callable`` (:mod:`.importing`) and the errors (:mod:`.errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_dist.conformance.engine.callables import (
    check_call,
    parse_gather_init,
    parse_gather_kwargs,
    parse_gather_output,
)
from nemo_dist.conformance.engine.declarations import SuiteTarget, suite_targets
from nemo_dist.conformance.engine.errors import MissingParameter, NotApplicable, NotSupported, OptionError
from nemo_dist.conformance.engine.implementation import (
    DDP_APIS,
    FSDP2_APIS,
    GROUP_PARAMETERS,
    DDPWrapper,
    Implementation,
)
from nemo_dist.conformance.engine.importing import import_path, resolve_callable
from nemo_dist.conformance.engine.wrapping import validate_wrapper

__all__ = [
    "COMPONENTS",
    "DDP_APIS",
    "GATHER_FORMS",
    "GROUP_PARAMETERS",
    "IMPLEMENTATION_OPTION_FIELDS",
    "PRESETS",
    "REFERENCE",
    "STANDALONE",
    "SUITE_TARGETS",
    "WRAPPER",
    "Implementation",
    "MissingParameter",
    "NotApplicable",
    "NotSupported",
    "OptionError",
    "checked_components",
    "implementation_from_options",
    "import_components",
    "resolve_callable",
    "resolve_implementation",
    "validate_implementation",
]

#: Output forms of a ``--gather-fn`` callable ("auto": detected from each call's result).
GATHER_FORMS: tuple[str, ...] = ("auto", "cat", "tuple", "stacked")

#: The components suites declare for themselves (:mod:`~nemo_dist.conformance.engine.declarations`), by component.
SUITE_TARGETS: dict[str, SuiteTarget] = {target.component: target for target in suite_targets()}
#: The components an implementation can name, in the order checks and reports list them: the engine's, then the
#: suites' own.
COMPONENTS: tuple[str, ...] = ("gather", "ddp", "config", "fsdp2", *SUITE_TARGETS)
#: Components whose module serves no other component's checks: imported and named only when checked themselves.
STANDALONE: frozenset[str] = frozenset({"fsdp2", *SUITE_TARGETS})
#: The option fields of every suite's own component.
_SUITE_FIELDS: tuple[str, ...] = tuple(f for target in SUITE_TARGETS.values() for f in target.fields)
#: The component of the behaviour checks of a ``--ddp-fn`` wrapper (checked with "ddp" when one is named).
WRAPPER = "wrapper"


def resolve_implementation(
    *,
    gather: str | None = None,
    ddp: str | None = None,
    config: str | None = None,
    preset: str | None = None,
    gather_fn: str | None = None,
    no_grad_fn: str | None = None,
    gather_form: str = "auto",
    gather_kwargs: Sequence[str] = (),
    gather_output: str | int | None = None,
    gather_init: Sequence[str] = (),
    ddp_wrapper: DDPWrapper | None = None,
    fsdp2: str | None = None,
    fsdp2_sync_ctx: str | None = None,
    suite_options: Mapping[str, Any] | None = None,
) -> tuple[Implementation, tuple[str, ...]]:
    """The implementation the options name and the components to check.

    A preset names every component's module (the other options override it);
    otherwise the named components are checked and the bundled modules serve
    the others (a DDP check needs a config class); naming nothing checks the
    bundled modules. ``gather_fn`` checks one callable as the gather component;
    ``gather_kwargs`` (``NAME=VALUE`` texts) and ``gather_output`` (an index)
    say how to call it, ``gather_init`` how to build a class before
    (:mod:`~nemo_dist.conformance.engine.callables`). ``ddp_wrapper`` checks a
    ``--ddp-fn`` wrapper as the ddp component, with the :data:`WRAPPER` checks.
    ``fsdp2_sync_ctx`` (``module:name``) is the fsdp2 component's
    ``get_sync_ctx`` where its module has none. ``suite_options`` are the
    values of the suites' own options (field -> value, None or empty when not
    given): a suite's component is checked when any of its fields is given,
    and a preset or the bundled run fills in what the suite declares for it.
    Raises ``OptionError`` for a bad combination; nothing is imported here.
    """
    if gather_form not in GATHER_FORMS:
        raise OptionError(f"{{opt:gather_form}} expects one of {', '.join(GATHER_FORMS)}; got {gather_form!r}")
    if gather_fn is not None and gather is not None:
        raise OptionError("{opt:gather} names a module and {opt:gather_fn} a callable; give one of them")
    if no_grad_fn is not None and gather_fn is None:
        raise OptionError(
            "{opt:no_grad_fn} goes with {opt:gather_fn} (a module's all_gather_no_grad is found by {opt:gather})"
        )
    if gather_form != "auto" and gather_fn is None:
        raise OptionError("{opt:gather_form} applies to a {opt:gather_fn} callable only")
    kwargs = parse_gather_kwargs(gather_kwargs)
    output = parse_gather_output(gather_output)
    init = parse_gather_init(gather_init)
    for field, given in (
        ("gather_kwarg", bool(kwargs)), ("gather_output", output is not None), ("gather_init", bool(init))
    ):
        if given and gather_fn is None:
            raise OptionError(
                f"{{opt:{field}}} applies to a {{opt:gather_fn}} callable only (a module's functions are "
                "called as the contract says)"
            )
    named = {c: p for c, p in (("gather", gather), ("ddp", ddp), ("config", config), ("fsdp2", fsdp2)) if p}
    suite_given = _given_suite_options(suite_options or {})
    suites_named = tuple(t.component for t in SUITE_TARGETS.values() if any(f in suite_given for f in t.fields))
    extra: dict[str, Any] = {
        "gather_fn": gather_fn,
        "no_grad_fn": no_grad_fn,
        "gather_form": gather_form,
        "gather_kwargs": kwargs,
        "gather_output": output,
        "gather_init": init,
    }
    if fsdp2_sync_ctx is not None:
        extra["fsdp2_sync_ctx"] = fsdp2_sync_ctx
    if gather_fn is not None:
        named["gather"] = None  # type: ignore[assignment]  # the callable replaces the module
    if ddp_wrapper is not None:
        if ddp is not None:
            raise OptionError("{opt:ddp} names a module and {opt:ddp_fn} a wrapper; give one of them")
        named["ddp"], extra["ddp_wrapper"] = None, ddp_wrapper  # type: ignore[assignment]
    wrapped = (WRAPPER,) if ddp_wrapper is not None else ()
    if preset is not None:
        if preset not in PRESETS:
            raise OptionError(
                f"unknown {{opt:preset}} {preset!r}; choose one of {', '.join(PRESETS)}, "
                "or name the modules with {opt:gather}/{opt:ddp}/{opt:config}/{opt:fsdp2}"
            )
        base = PRESETS[preset]
        paths = {c: named.get(c, getattr(base, c)) for c in _ENGINE_COMPONENTS}
        extra.setdefault("fsdp2_sync_ctx", base.fsdp2_sync_ctx if "fsdp2" not in named else None)
        preset_values = {  # the bundled preset checks what each suite bundles
            f: v
            for t in SUITE_TARGETS.values()
            for f, v in t.presets.get(preset, t.reference if base is REFERENCE else {}).items()
        }
        extra["suite_options"] = _as_pairs({**preset_values, **suite_given})
        impl = Implementation(**paths, **extra)
        return impl, (*(c for c in checked_components(impl) if c != WRAPPER), *wrapped)
    if not named and not suites_named:
        return REFERENCE, COMPONENTS
    paths = {c: named.get(c, getattr(REFERENCE, c)) for c in _ENGINE_COMPONENTS}
    for target in SUITE_TARGETS.values():
        if target.component in suites_named and not any(f in suite_given for f in target.subject_fields):
            suite_given.update({f: v for f, v in target.reference.items() if f in target.subject_fields})
    extra["suite_options"] = _as_pairs(suite_given)
    checked = (*(c for c in COMPONENTS if c in named or c in suites_named), *wrapped)
    return Implementation(**paths, **extra), checked


_ENGINE_COMPONENTS: tuple[str, ...] = ("gather", "ddp", "config", "fsdp2")


def _given_suite_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The suites' options that were given (not None, not an empty list), a repeatable one's list as a tuple."""
    given: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value is False or (isinstance(value, (list, tuple)) and not value):
            continue
        given[name] = tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else value
    return given


def _as_pairs(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``values`` as :attr:`Implementation.suite_options` holds them: pairs in the suites' field order."""
    order = {f: i for i, f in enumerate(_SUITE_FIELDS)}
    return tuple(sorted(values.items(), key=lambda item: order.get(item[0], len(order))))


#: The options naming what is checked, as :func:`implementation_from_options` reads them (their table fields).
IMPLEMENTATION_OPTION_FIELDS: tuple[str, ...] = (
    "gather", "ddp", "config", "fsdp2", "preset", "gather_fn", "no_grad_fn", "gather_form", "gather_kwarg",
    "gather_output", "gather_init", "fsdp2_sync_ctx", *_SUITE_FIELDS,
)
#: Option fields whose :func:`resolve_implementation` keyword has another name (the repeatable ones, plural).
_KEYWORDS = {"gather_kwarg": "gather_kwargs"}


def implementation_from_options(
    value: Callable[[str], Any], ddp_wrapper: DDPWrapper | None
) -> tuple[Implementation, tuple[str, ...]]:
    """:func:`resolve_implementation` of a front end's options, then :func:`validate_implementation` of what it gives.

    ``value(field)`` reads each of :data:`IMPLEMENTATION_OPTION_FIELDS` (None, or
    an empty list for a repeatable option, when not given); ``ddp_wrapper``
    is the ``--ddp-fn`` wrapper they name (``wrapping.wrapper_from_options``).
    Raises ``OptionError``, which each front end words in its own spelling.
    """
    engine_fields = [field for field in IMPLEMENTATION_OPTION_FIELDS if field not in _SUITE_FIELDS]
    given = {_KEYWORDS.get(field, field): value(field) for field in engine_fields}
    suites = {field: value(field) for field in _SUITE_FIELDS}
    impl, components = resolve_implementation(**given, ddp_wrapper=ddp_wrapper, suite_options=suites)
    validate_implementation(impl, components)
    return impl, components


#: Names a module of each component must define (the ddp module: at least one).
REQUIRED: dict[str, tuple[str, ...]] = {
    "gather": ("all_gather_with_grad", "all_gather_no_grad"),
    "config": ("DDPConfig",),
    "fsdp2": ("FSDP2Config",),
}


def validate_implementation(impl: Implementation, components: Sequence[str] = COMPONENTS) -> None:
    """Import every module and callable ``impl`` names and check the required names.

    A :data:`STANDALONE` component's module serves no other component, so it
    is imported only when ``components`` (those checked) include it:
    importing torch's FSDP2 costs about a second. Raises ``OptionError`` naming the option, the
    module and the remedy.
    """
    for target in SUITE_TARGETS.values():
        if target.component in components:
            _validate_suite_target(target, impl)
    for component in _ENGINE_COMPONENTS:
        path = getattr(impl, component)
        if path is None or (component in STANDALONE and component not in components):
            continue
        try:
            module = import_path(path)
        except OptionError as exc:
            raise OptionError(f"{{opt:{component}}} module {path!r} does not import: {exc.template}") from None
        if component == "fsdp2" and not any(hasattr(module, api) for api in FSDP2_APIS):
            raise OptionError(
                f"{{opt:fsdp2}} module {path!r} has neither FSDP2Manager nor fsdp2_strategy_parallelize; "
                "a fsdp2 module must define FSDP2Config and at least one of them"
            )
        if component == "ddp":
            if not any(hasattr(module, api) for api in DDP_APIS):
                raise OptionError(
                    f"{{opt:ddp}} module {path!r} has neither parallelize_ddp nor DDPManager; "
                    "a ddp module must define at least one of them"
                )
            continue
        missing = [n for n in REQUIRED[component] if not hasattr(module, n)]
        if missing:
            raise OptionError(
                f"{{opt:{component}}} module {path!r} has no {', '.join(missing)}; "
                f"a {component} module must define {', '.join(REQUIRED[component])}"
            )
    if impl.fsdp2_sync_ctx is not None and "fsdp2" in components:
        try:
            resolve_callable(impl.fsdp2_sync_ctx)
        except OptionError as exc:
            raise OptionError(f"{{opt:fsdp2_sync_ctx}}: {exc.template}") from None
    for field, spec in (("gather_fn", impl.gather_fn), ("no_grad_fn", impl.no_grad_fn)):
        if spec is not None:
            try:
                found = resolve_callable(spec)
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}}: {exc.template}") from None
            check_call(field, spec, found, impl)
    if impl.ddp_wrapper is not None:
        validate_wrapper(impl.ddp_wrapper)


def _validate_suite_target(target: SuiteTarget, impl: Implementation) -> None:
    """Import a suite component's module (its required names defined) and run the suite's own validation."""
    path = impl.suite_option(target.module_field) if target.module_field else None
    if path is not None:
        try:
            module = import_path(path)
        except OptionError as exc:
            raise OptionError(
                f"{{opt:{target.module_field}}} module {path!r} does not import: {exc.template}"
            ) from None
        missing = [n for n in target.required if not hasattr(module, n)]
        if missing:
            raise OptionError(
                f"{{opt:{target.module_field}}} module {path!r} has no {', '.join(missing)}; "
                f"a {target.component} module must define {', '.join(target.required)}"
            )
    if target.validate is not None:
        resolve_callable(target.validate)(impl)


#: The bundled implementation: the engine's modules and what each suite declares for its own component.
REFERENCE = Implementation(
    suite_options=_as_pairs({f: v for t in SUITE_TARGETS.values() for f, v in t.reference.items()})
)

#: Named module layouts, for ``--preset``.
PRESETS = {
    "nemo_dist": REFERENCE,
    "nemo_automodel": Implementation(
        gather="nemo_automodel.components.loss.dist_utils",
        ddp="nemo_automodel.components.distributed.ddp",
        config="nemo_automodel.components.distributed.config",
        fsdp2="nemo_automodel.components.distributed.fsdp2",
        fsdp2_sync_ctx="nemo_automodel.components.distributed.utils:get_sync_ctx",
    ),
}


def import_components(impl: Implementation, components: Sequence[str] = COMPONENTS) -> None:
    """Import every module ``impl`` names (run on each rank before its checks: imports cost seconds).

    A :data:`STANDALONE` component's module only where ``components`` (those
    whose checks run) include it.
    """
    for component in _ENGINE_COMPONENTS:
        if getattr(impl, component) is not None and (component not in STANDALONE or component in components):
            impl.module(component)
    for target in SUITE_TARGETS.values():
        if target.component in components and target.module_field and impl.suite_option(target.module_field):
            impl.module(target.module_field)


def checked_components(impl: Implementation) -> tuple[str, ...]:
    """The components ``impl`` names (a module, or a gather callable), in the order gather, ddp, config, fsdp2, suites'.

    A ``--ddp-fn`` wrapper is the ddp component, followed by :data:`WRAPPER`.
    """
    named = {"gather": impl.gather_named, "ddp": impl.ddp is not None or impl.ddp_wrapper is not None,
             "config": impl.config is not None, "fsdp2": impl.fsdp2 is not None}
    for target in SUITE_TARGETS.values():
        named[target.component] = any(impl.suite_option(f) is not None for f in target.fields)
    return (*(c for c in COMPONENTS if named[c]), *((WRAPPER,) if impl.ddp_wrapper is not None else ()))
