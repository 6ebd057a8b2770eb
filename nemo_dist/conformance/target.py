"""Which implementation a check runs against: module paths and callables, imported in each rank.

An :class:`Implementation` names modules (``gather``, ``ddp``, ``config``) or,
for the gather component, one callable found anywhere (``gather_fn``, a
``module:name``). Only these strings travel to the ranks; each rank imports
them itself. :func:`resolve_implementation` turns command-line style options
into an implementation and :func:`validate_implementation` imports what it
names, so the command and ``pytest conformance/`` agree on both. Their
errors name options by field; each front end words them in its own option
names (:meth:`OptionError.worded`).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nemo_dist.conformance.errors import MissingParameter, NotApplicable, NotSupported, OptionError

if TYPE_CHECKING:
    from nemo_dist.conformance.wrapping import DDPWrapper

__all__ = [
    "COMPONENTS",
    "DDP_APIS",
    "GATHER_FORMS",
    "GROUP_PARAMETERS",
    "PRESETS",
    "REFERENCE",
    "WRAPPER",
    "Implementation",
    "MissingParameter",
    "NotApplicable",
    "NotSupported",
    "OptionError",
    "checked_components",
    "import_components",
    "resolve_callable",
    "resolve_implementation",
    "validate_implementation",
]

#: The two upstream DDP entry points, in the order their checks run.
DDP_APIS: tuple[str, ...] = ("parallelize_ddp", "DDPManager")

#: Output forms of a ``--gather-fn`` callable ("auto": detected from each call's result).
GATHER_FORMS: tuple[str, ...] = ("auto", "cat", "tuple", "stacked")

#: Parameter names taken to be a process group (the checks pass it, as they pass ``uneven=``).
GROUP_PARAMETERS: tuple[str, ...] = ("group", "process_group", "pg")

#: The components an implementation can name, in the order checks and reports list them.
COMPONENTS: tuple[str, ...] = ("gather", "ddp", "config")
#: The component of the behaviour checks of a ``--ddp-fn`` wrapper (checked with "ddp" when one is named).
WRAPPER = "wrapper"

@dataclass(frozen=True)
class Implementation:
    """What to check: module paths of the components, or one gather callable.

    ``gather``, ``ddp``, ``config`` are module paths (``None``: not named).
    ``gather_fn`` (``"module:name"``) replaces the gather module by a single
    callable, a function or a ``torch.autograd.Function`` subclass, whose output
    is the concatenation, a W-tuple or a stacked tensor (``gather_form``);
    ``no_grad_fn`` is its no-grad counterpart (default: ``gather_fn`` under
    ``torch.no_grad()``). ``gather_kwargs`` are ``(name, Python literal)``
    pairs passed as keywords on every call of either callable (kept as text
    so the object stays hashable; :meth:`gather_call_kwargs` evaluates them;
    ``@name`` is a symbol each call fills, see
    :data:`~nemo_dist.conformance.callables.SYMBOLS`);
    ``gather_output`` picks the gathered value out of a tuple or list return
    (``None``: the return is the gathered value). ``gather_init`` are the
    same pairs for a class built once per rank before it is called
    (``--gather-init``). ``ddp_api`` pins the DDP entry point the rank
    functions use (``"parallelize_ddp"`` or ``"DDPManager"``; ``None``: the
    manager when the module has one). ``ddp_wrapper`` replaces the ddp module by a
    ``--ddp-fn`` wrapper (:mod:`~nemo_dist.conformance.wrapping`). The object pickles as its strings.
    """

    gather: str | None = "nemo_dist.loss.dist_utils"
    ddp: str | None = "nemo_dist.distributed.ddp"
    config: str | None = "nemo_dist.distributed.config"
    gather_fn: str | None = None
    no_grad_fn: str | None = None
    gather_form: str = "auto"
    ddp_api: str | None = None
    gather_kwargs: tuple[tuple[str, str], ...] = ()
    gather_output: int | None = None
    gather_init: tuple[tuple[str, str], ...] = ()
    ddp_wrapper: DDPWrapper | None = None

    def module(self, component: str) -> ModuleType:
        """Import and return the module of ``component`` ("gather", "ddp" or "config").

        Raises ``NotSupported`` when that component is not part of this implementation.
        """
        path = getattr(self, component)
        if path is None:
            raise NotSupported(f"no {component} module was named")
        return importlib.import_module(path)

    @property
    def gather_named(self) -> bool:
        """Whether the gather component is checked (a module or a callable is named)."""
        return self.gather is not None or self.gather_fn is not None

    @property
    def gather_label(self) -> str:
        """How reports name the gather target: the callable (with its keywords and output index), else the module."""
        if self.gather_fn is None:
            return self.gather or "-"
        if not self.gather_kwargs and self.gather_output is None and not self.gather_init:
            return self.gather_fn
        keywords = "".join(f", {name}={value}" for name, value in self.gather_kwargs)
        built = f"({', '.join(f'{name}={value}' for name, value in self.gather_init)})" if self.gather_init else ""
        picked = "" if self.gather_output is None else f"[{self.gather_output}]"
        return f"{self.gather_fn}{built}(x{keywords}){picked}"

    @property
    def ddp_label(self) -> str | None:
        """How reports name the DDP target: the wrapper's call, else the module."""
        return self.ddp if self.ddp_wrapper is None else self.ddp_wrapper.label

    def gather_call_kwargs(self) -> dict[str, Any]:
        """The keywords ``gather_kwargs`` names, their values evaluated (a literal, or a ``Symbol`` for ``@name``)."""
        from nemo_dist.conformance.callables import value_of

        return {name: value_of(value) for name, value in self.gather_kwargs}

    def gather_init_kwargs(self) -> dict[str, Any]:
        """The constructor keywords ``gather_init`` names, evaluated as :meth:`gather_call_kwargs` does."""
        from nemo_dist.conformance.callables import value_of

        return {name: value_of(value) for name, value in self.gather_init}

    def ddp_apis(self) -> tuple[str, ...]:
        """The DDP entry points the ddp module defines (``ddp_api`` alone when pinned), in :data:`DDP_APIS` order."""
        if self.ddp_api is not None:
            return (self.ddp_api,)
        if self.ddp_wrapper is not None:
            return ()
        module = self.module("ddp")
        return tuple(api for api in DDP_APIS if hasattr(module, api))

    def with_ddp_api(self, api: str) -> Implementation:
        """This implementation with the DDP entry point pinned to ``api``."""
        return replace(self, ddp_api=api)

    def resolved_ddp_api(self) -> str:
        """The entry point rank functions use: the pinned one, else ``DDPManager`` when present."""
        if self.ddp_api is not None:
            return self.ddp_api
        apis = self.ddp_apis()
        if not apis:
            raise NotSupported(f"{self.ddp} defines neither parallelize_ddp nor DDPManager")
        return "DDPManager" if "DDPManager" in apis else apis[0]


def resolve_callable(
    spec: str,
    example: str = "torch.distributed.nn.functional:all_gather",
    what: str = "a function or autograd Function",
) -> Any:
    """Import ``"module:name"`` (``name`` may be dotted) and return the object.

    Raises ``OptionError`` saying what is wrong with the spec (``example``
    shows a good one; ``what`` says what the object must be).
    """
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise OptionError(f"expected MODULE:NAME, such as {example}; got {spec!r}")
    try:
        module = _import(module_name)
    except OptionError as exc:
        raise OptionError(f"module {module_name!r} does not import: {exc.template}") from None
    found: Any = module
    for part in qualname.split("."):
        if not hasattr(found, part):
            raise OptionError(f"{module_name!r} has no {qualname!r} (from {spec!r})")
        found = getattr(found, part)
    if not callable(found):
        raise OptionError(f"{spec!r} is a {type(found).__name__}, not {what}")
    return found


def _import(path: str) -> ModuleType:
    """Import ``path``; an ``OptionError`` carries the reason (and a hint for a missing module)."""
    try:
        return importlib.import_module(path)
    except Exception as exc:
        hint = (
            " (is it on sys.path? run from the checkout that holds it, or pip install it)"
            if isinstance(exc, ModuleNotFoundError)
            else ""
        )
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        raise OptionError(f"{last}{hint}") from None


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
) -> tuple[Implementation, tuple[str, ...]]:
    """The implementation the options name and the components to check.

    A preset names all three modules (the other options override it);
    otherwise the named components are checked and the bundled modules serve
    the others (a DDP check needs a config class); naming nothing checks the
    bundled modules. ``gather_fn`` checks one callable as the gather component;
    ``gather_kwargs`` (``NAME=VALUE`` texts) and ``gather_output`` (an index)
    say how to call it, ``gather_init`` how to build a class before
    (:mod:`~nemo_dist.conformance.callables`). ``ddp_wrapper`` checks a
    ``--ddp-fn`` wrapper as the ddp component, with the :data:`WRAPPER` checks.
    Raises ``OptionError`` for a bad combination; nothing is imported here.
    """
    from nemo_dist.conformance.callables import parse_gather_init, parse_gather_kwargs, parse_gather_output

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
    named = {c: p for c, p in (("gather", gather), ("ddp", ddp), ("config", config)) if p}
    extra: dict[str, Any] = {
        "gather_fn": gather_fn,
        "no_grad_fn": no_grad_fn,
        "gather_form": gather_form,
        "gather_kwargs": kwargs,
        "gather_output": output,
        "gather_init": init,
    }
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
                "or name the modules with {opt:gather}/{opt:ddp}/{opt:config}"
            )
        base = PRESETS[preset]
        paths = {c: named.get(c, getattr(base, c)) for c in COMPONENTS}
        return Implementation(**paths, **extra), (*COMPONENTS, *wrapped)
    if not named:
        return REFERENCE, COMPONENTS
    paths = {c: named.get(c, getattr(REFERENCE, c)) for c in COMPONENTS}
    return Implementation(**paths, **extra), (*(c for c in COMPONENTS if c in named), *wrapped)


#: Names a module of each component must define (the ddp module: at least one).
REQUIRED: dict[str, tuple[str, ...]] = {
    "gather": ("all_gather_with_grad", "all_gather_no_grad"),
    "config": ("DDPConfig",),
}


def validate_implementation(impl: Implementation) -> None:
    """Import every module and callable ``impl`` names and check the required names.

    Raises ``OptionError`` naming the option, the module and the remedy.
    """
    from nemo_dist.conformance.callables import check_call

    for component in COMPONENTS:
        path = getattr(impl, component)
        if path is None:
            continue
        try:
            module = _import(path)
        except OptionError as exc:
            raise OptionError(f"{{opt:{component}}} module {path!r} does not import: {exc.template}") from None
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
    for field, spec in (("gather_fn", impl.gather_fn), ("no_grad_fn", impl.no_grad_fn)):
        if spec is not None:
            try:
                found = resolve_callable(spec)
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}}: {exc.template}") from None
            check_call(field, spec, found, impl)
    if impl.ddp_wrapper is not None:
        from nemo_dist.conformance.wrapping import validate_wrapper

        validate_wrapper(impl.ddp_wrapper)



#: The bundled implementation.
REFERENCE = Implementation()

#: Named module layouts, for ``--preset``.
PRESETS = {
    "nemo_dist": REFERENCE,
    "nemo_automodel": Implementation(
        gather="nemo_automodel.components.loss.dist_utils",
        ddp="nemo_automodel.components.distributed.ddp",
        config="nemo_automodel.components.distributed.config",
    ),
}


def import_components(impl: Implementation) -> None:
    """Import every module ``impl`` names (run on each rank before its checks: imports cost seconds)."""
    for component in COMPONENTS:
        if getattr(impl, component) is not None:
            impl.module(component)


def checked_components(impl: Implementation) -> tuple[str, ...]:
    """The components ``impl`` names (a module, or a gather callable), in the order gather, ddp, config.

    A ``--ddp-fn`` wrapper is the ddp component, followed by :data:`WRAPPER`.
    """
    named = {"gather": impl.gather_named, "ddp": impl.ddp is not None or impl.ddp_wrapper is not None,
             "config": impl.config is not None}
    return (*(c for c in COMPONENTS if named[c]), *((WRAPPER,) if impl.ddp_wrapper is not None else ()))
