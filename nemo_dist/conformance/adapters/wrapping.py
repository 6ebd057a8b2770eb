"""The ``--ddp-fn`` wrapper: which callable wraps a model for data parallelism, how it is called, how a step runs.

A :class:`~nemo_dist.conformance.engine.implementation.DDPWrapper` (plain data,
defined with the ``Implementation`` that carries it; re-exported here)
names one callable found anywhere (``MODULE:NAME``) and how the checks use it:

- a function taking the model, or a class constructed with the model:
  ``fn(model, **kwargs)``; the model goes to the parameter named ``model``
  or ``module``, else to the first positional one that no keyword names
  (``DistributedFairseqModel(args, model)`` takes ``args`` as a keyword and
  the model as ``model=``);
- with ``method``, a class constructed from the keywords whose method takes
  the model: ``fn(**kwargs).method(model)`` (Lightning's ``DDPStrategy``);
- ``kwargs``: ``NAME=VALUE`` pairs (VALUE a Python literal, or ``@mesh``:
  the world's DeviceMesh, 2-D with ``mesh``) passed on every call, where the
  DDP field keywords go too;
- ``output``: the index of the wrapped model in a tuple or list return
  (ColossalAI's ``configure``); a None return means the model was changed in
  place (composable ``replicate``).

How a training step runs through what came back: ``after_backward`` (a
method called after each backward that syncs, Megatron's
``finish_grad_sync``), ``grad_attr`` (the parameter attribute holding the
reduced gradient, ``main_grad``; default ``.grad``), ``zero_grad`` (a method
clearing the gradients each step, ``zero_grad_buffer``). ``reduction``
(``mean`` or ``sum``) and ``buffers`` (``synced``, ``local`` or undeclared)
are what the user declares the wrapper does; so is ``start`` (``identical``:
it expects identical weights on every rank instead of synchronising them).

:func:`parse_wrapper` and :func:`validate_wrapper` run before any world
starts; their errors are :class:`~nemo_dist.conformance.engine.errors.OptionError`
naming option fields (``{opt:ddp_fn}``), worded by each front end. The rank
side that calls the wrapper is :mod:`nemo_dist.conformance.suites.ddp.wrapped`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from nemo_dist.conformance.adapters import signature
from nemo_dist.conformance.adapters.callables import missing_parameter_error, parse_keyword_pairs, parse_output_index
from nemo_dist.conformance.adapters.symbols import WRAPPER_SYMBOLS
from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.importing import resolve_callable

__all__ = [
    "BUFFERS",
    "DDP_FIELD_KEYWORDS",
    "DTYPES",
    "MODEL_PARAMETERS",
    "REDUCTIONS",
    "STARTS",
    "WRAPPER_OPTION_FIELDS",
    "DDPWrapper",
    "accepts",
    "call_arguments",
    "check_mesh_world_sizes",
    "parse_wrapper",
    "receivers",
    "validate_ddp",
    "validate_wrapper",
    "wrapper_from_options",
]

#: The DDPConfig fields DistributedDataParallel takes: a wrapper gets them by name or through ``**kwargs``.
DDP_FIELD_KEYWORDS: tuple[str, ...] = (
    "broadcast_buffers",
    "find_unused_parameters",
    "static_graph",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
)
#: Values of ``--ddp-reduction``: how the wrapper combines the ranks' gradients.
REDUCTIONS: tuple[str, ...] = ("mean", "sum")
#: Values of ``--ddp-buffers``: what the wrapper does with module buffers.
BUFFERS: tuple[str, ...] = ("synced", "local")
#: Values of ``--ddp-start``: the wrapper synchronises the start itself (the default), or expects it identical.
STARTS: tuple[str, ...] = ("broadcast", "identical")
#: The dtypes ``--ddp-compute-dtype`` and ``--ddp-reduce-dtype`` take, by their torch names.
DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")

#: The option fields (``{opt:FIELD}``) of a ``--ddp-fn`` wrapper, as every front end declares them.
WRAPPER_OPTION_FIELDS: tuple[str, ...] = (
    "ddp_fn",
    "ddp_method",
    "ddp_kwarg",
    "ddp_output",
    "ddp_reduction",
    "ddp_buffers",
    "ddp_after_backward",
    "ddp_grad_attr",
    "ddp_zero_grad",
    "ddp_start",
    "ddp_mesh",
    "ddp_compute_dtype",
    "ddp_reduce_dtype",
)

_P = inspect.Parameter
_EXAMPLE = "torch.nn.parallel:DistributedDataParallel"


def _keyword_pairs(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--ddp-kwarg`` texts as ``(name, literal)`` pairs; ``OptionError`` for a malformed or refused item."""
    pairs = parse_keyword_pairs(items, "ddp_kwarg", tuple(WRAPPER_SYMBOLS), "fp16_compression=True")
    for name, text in pairs.items():
        if name in DDP_FIELD_KEYWORDS:
            raise OptionError(
                f"{{opt:ddp_kwarg}} '{name}={text}': the ddp field checks pass {name}= themselves where they vary "
                "it (the wrapper checks pass none: the wrapper's own default); leave it out"
            )
    return tuple(pairs.items())


def _method_name(field: str, text: str | None, example: str) -> str | None:
    """An identifier option (a method or attribute name), or None when not given; ``OptionError`` otherwise."""
    if text is None:
        return None
    name = text.strip()
    if not name.isidentifier():
        raise OptionError(f"{{opt:{field}}} expects a name, such as {{opt:{field}}} {example}; got {text!r}")
    return name


def _mesh_shape(text: str | None, kwargs: tuple[tuple[str, str], ...]) -> tuple[int, int] | None:
    """``--ddp-mesh RxS`` as ``(R, S)``; ``OptionError`` for a malformed value or no ``@mesh`` to shape."""
    if text is None:
        return None
    r, sep, s = text.strip().lower().partition("x")
    if not sep or not r.isdigit() or not s.isdigit() or int(r) < 1 or int(s) < 1:
        raise OptionError(
            f"{{opt:ddp_mesh}} expects RxS (replicas x shards), such as {{opt:ddp_mesh}} 2x2; got {text!r}"
        )
    if not any(value == "@mesh" for _, value in kwargs):
        raise OptionError(
            "{opt:ddp_mesh} shapes the @mesh a {opt:ddp_kwarg} passes, and none does; pass it, such as "
            "{opt:ddp_kwarg} mesh=@mesh"
        )
    return int(r), int(s)


def check_mesh_world_sizes(wrapper: DDPWrapper | None, sizes: Sequence[int], sizes_option: str) -> None:
    """Raise ``OptionError`` when ``--ddp-mesh RxS`` fits none of the world ``sizes`` (R*S is none of them).

    ``sizes_option`` is how the front end spells the option selecting world
    sizes (``--world-sizes``). Sizes other than R*S are reported not
    applicable by the checks themselves.
    """
    if wrapper is None or wrapper.mesh is None:
        return
    r, s = wrapper.mesh
    if r * s not in sizes:
        raise OptionError(
            f"{{opt:ddp_mesh}} {r}x{s} makes a mesh of {r * s} ranks, and no selected world has {r * s} "
            f"(world sizes {', '.join(map(str, sizes))}); select it, such as {sizes_option} {r * s}"
        )


def _choice(field: str, text: str | None, choices: tuple[str, ...]) -> str | None:
    if text is None or text in choices:
        return text
    raise OptionError(f"{{opt:{field}}} expects one of {', '.join(choices)}; got {text!r}")


def parse_wrapper(
    *,
    ddp_fn: str | None = None,
    ddp_method: str | None = None,
    ddp_kwargs: Sequence[str] = (),
    ddp_output: str | int | None = None,
    ddp_reduction: str | None = None,
    ddp_buffers: str | None = None,
    ddp_after_backward: str | None = None,
    ddp_grad_attr: str | None = None,
    ddp_zero_grad: str | None = None,
    ddp_start: str | None = None,
    ddp_mesh: str | None = None,
    ddp_compute_dtype: str | None = None,
    ddp_reduce_dtype: str | None = None,
) -> DDPWrapper | None:
    """The :class:`DDPWrapper` the ``--ddp-*`` options name, or None without ``ddp_fn``.

    Raises ``OptionError`` for a malformed value or an option given without
    ``ddp_fn``; nothing is imported here (:func:`validate_wrapper` does that).
    """
    given = {
        "ddp_method": ddp_method is not None,
        "ddp_kwarg": bool(ddp_kwargs),
        "ddp_output": ddp_output is not None,
        "ddp_reduction": ddp_reduction is not None,
        "ddp_buffers": ddp_buffers is not None,
        "ddp_after_backward": ddp_after_backward is not None,
        "ddp_grad_attr": ddp_grad_attr is not None,
        "ddp_zero_grad": ddp_zero_grad is not None,
        "ddp_start": ddp_start is not None,
        "ddp_mesh": ddp_mesh is not None,
        "ddp_compute_dtype": ddp_compute_dtype is not None,
        "ddp_reduce_dtype": ddp_reduce_dtype is not None,
    }
    if ddp_fn is None:
        for field, present in given.items():
            if present:
                raise OptionError(
                    f"{{opt:{field}}} applies to a {{opt:ddp_fn}} wrapper only (the entry points of a {{opt:ddp}} "
                    "module are called as the contract says)"
                )
        return None
    module, sep, name = ddp_fn.partition(":")
    if not sep or not module or not name:
        raise OptionError(f"{{opt:ddp_fn}} expects MODULE:NAME, such as {{opt:ddp_fn}} {_EXAMPLE}; got {ddp_fn!r}")
    output = parse_output_index("ddp_output", ddp_output, "the wrapped model")
    kwargs = _keyword_pairs(ddp_kwargs)
    start = _choice("ddp_start", ddp_start, STARTS)
    return DDPWrapper(
        fn=ddp_fn,
        method=_method_name("ddp_method", ddp_method, "setup_module"),
        kwargs=kwargs,
        output=output,
        reduction=_choice("ddp_reduction", ddp_reduction, REDUCTIONS) or "mean",
        buffers=_choice("ddp_buffers", ddp_buffers, BUFFERS),
        after_backward=_method_name("ddp_after_backward", ddp_after_backward, "finish_grad_sync"),
        grad_attr=_method_name("ddp_grad_attr", ddp_grad_attr, "main_grad"),
        zero_grad=_method_name("ddp_zero_grad", ddp_zero_grad, "zero_grad_buffer"),
        start=None if start == "broadcast" else start,
        mesh=_mesh_shape(ddp_mesh, kwargs),
        compute_dtype=_choice("ddp_compute_dtype", ddp_compute_dtype, DTYPES),
        reduce_dtype=_choice("ddp_reduce_dtype", ddp_reduce_dtype, DTYPES) or "float32",
    )


def wrapper_from_options(value: Callable[[str], Any]) -> DDPWrapper | None:
    """:func:`parse_wrapper` of a front end's options: ``value(field)`` reads each of :data:`WRAPPER_OPTION_FIELDS`.

    ``value`` returns None (an empty list for the repeatable ``ddp_kwarg``) for an option not given.
    """
    values = {field: value(field) for field in WRAPPER_OPTION_FIELDS}
    return parse_wrapper(**{"ddp_kwargs" if field == "ddp_kwarg" else field: v for field, v in values.items()})


def _parameters(fn: Any, drop_first: bool = False) -> tuple[inspect.Parameter, ...] | None:
    """The parameters of ``fn`` (a class: its constructor's, without ``self``); None when unreadable."""
    try:
        found = tuple(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return found[1:] if drop_first and found else found


def _method_parameters(cls: type, method: str) -> tuple[inspect.Parameter, ...] | None:
    """The parameters of ``cls.method`` as called on an instance (``self`` left out)."""
    raw = inspect.getattr_static(cls, method, None)
    bound = isinstance(raw, (staticmethod, classmethod))
    return _parameters(getattr(cls, method), drop_first=not bound)


def receivers(
    found: Any, method: str | None
) -> tuple[tuple[inspect.Parameter, ...] | None, tuple[inspect.Parameter, ...] | None]:
    """The parameters of what takes the keywords and of what takes the model (each None when unreadable).

    Without ``method`` both are the callable's own (a class: its constructor's);
    with one, the constructor's and the method's.
    """
    own = _parameters(found)
    if method is None:
        return own, own
    return own, _method_parameters(found, method)


def accepts(parameters: tuple[inspect.Parameter, ...] | None, name: str, *, var_keyword: bool) -> bool:
    """Whether a callable of ``parameters`` takes keyword ``name`` (by name, or ``**kwargs`` when ``var_keyword``).

    An unreadable signature (None) is taken to accept it: the call tells.
    """
    if parameters is None:
        return True
    for p in parameters:
        if p.name == name and p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY):
            return True
    return var_keyword and any(p.kind is _P.VAR_KEYWORD for p in parameters)


#: Parameter names taken to be the model, before the first free positional parameter.
MODEL_PARAMETERS: tuple[str, ...] = ("model", "module")


def _model_parameter(parameters: tuple[inspect.Parameter, ...], given: Sequence[str]) -> inspect.Parameter | None:
    """The parameter the model goes to (None: there is none).

    One named ``model`` or ``module``, else the first positional one that no keyword names.
    """
    free = [p for p in parameters if p.name not in given and p.kind is not _P.VAR_KEYWORD]
    named = [p for p in free if p.name in MODEL_PARAMETERS and p.kind is not _P.VAR_POSITIONAL]
    if named:
        return named[0]
    for p in parameters:
        if p.kind is _P.VAR_POSITIONAL:
            return p
        if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD) and p.name not in given:
            return p
    return None


def call_arguments(
    parameters: tuple[inspect.Parameter, ...] | None, model: Any, keywords: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The positional arguments and keywords that pass ``model`` and ``keywords`` to a callable of ``parameters``.

    The model goes first by position when its parameter comes first (or the
    signature is unreadable), else by keyword under its parameter's name.
    """
    if parameters is None:
        return [model], dict(keywords)
    slot = _model_parameter(parameters, list(keywords))
    if slot is None or slot.kind is _P.VAR_POSITIONAL or (slot is parameters[0] and slot.kind is not _P.KEYWORD_ONLY):
        return [model], dict(keywords)
    return [], {slot.name: model, **keywords}


def validate_wrapper(wrapper: DDPWrapper) -> None:
    """Import the wrapper and read its signatures: raise ``OptionError`` where the call cannot work.

    Checked before any world starts: the callable imports; ``--ddp-method``
    names a method of a class; something takes the model; every required
    parameter is filled (else ``MissingParameter`` naming ``--ddp-kwarg``);
    every ``--ddp-kwarg`` is taken; a class returned as it is has the
    step-protocol methods named. What a function returns is checked by
    its first call in each world.
    """
    try:
        found = resolve_callable(wrapper.fn, example=_EXAMPLE, what="a function or a class")
    except OptionError as exc:
        raise OptionError(f"{{opt:ddp_fn}}: {exc.template}") from None
    if wrapper.method is not None:
        if not isinstance(found, type):
            raise OptionError(
                f"{{opt:ddp_method}} {wrapper.method}: {wrapper.fn} is a {type(found).__name__}, not a class; "
                "{opt:ddp_method} names a method of a class built from the keywords, such as "
                "{opt:ddp_fn} my_trainer.strategies:DDPStrategy {opt:ddp_method} setup_module"
            )
        if not callable(getattr(found, wrapper.method, None)):
            raise OptionError(f"{{opt:ddp_method}} {wrapper.method}: {wrapper.fn} has no method {wrapper.method!r}")
    takes_keywords, takes_model = receivers(found, wrapper.method)
    given = [name for name, _ in wrapper.kwargs]
    model_name = ""
    if takes_model is not None:
        on_model = () if wrapper.method is not None else given
        slot = _model_parameter(takes_model, on_model)
        where = f"{wrapper.fn}.{wrapper.method}" if wrapper.method else wrapper.fn
        if slot is None:
            raise OptionError(f"{{opt:ddp_fn}} {where} takes no parameter for the model (it takes: "
                              f"{', '.join(p.name for p in takes_model) or 'nothing'})")
        model_name = slot.name
        if wrapper.method is not None:
            rest = tuple(p for p in takes_model if p is not slot)
            missing = signature.unfilled(rest, (), ())
            if missing:
                raise OptionError(
                    f"{{opt:ddp_method}} {where} has required parameter {missing[0]!r} besides the model; "
                    "the checks call it with the model alone"
                )
    if takes_keywords is not None:
        _check_keywords(wrapper, takes_keywords, given, model_name if wrapper.method is None else "")
    if isinstance(found, type) and wrapper.method is None and wrapper.output is None:
        for field, name in (("ddp_after_backward", wrapper.after_backward), ("ddp_zero_grad", wrapper.zero_grad)):
            if name is not None and not callable(getattr(found, name, None)):
                raise OptionError(f"{{opt:{field}}} {name}: {wrapper.fn} has no method {name!r}")


def _check_keywords(
    wrapper: DDPWrapper, parameters: tuple[inspect.Parameter, ...], given: list[str], model_name: str
) -> None:
    """Raise when a required parameter is left unfilled or a ``--ddp-kwarg`` is not taken."""
    where = f"{wrapper.fn}(...)" if wrapper.method else wrapper.fn
    missing = signature.unfilled(parameters, given, (model_name,) if model_name else ())
    if missing:
        plural = len(missing) > 1
        raise missing_parameter_error(
            f"{{opt:ddp_fn}} {where}", parameters, missing, "ddp_kwarg",
            f"pass {'them' if plural else 'it'} on every call with",
        )
    unknown = signature.not_taken(parameters, given, False)
    if unknown:
        takes = ", ".join(p.name for p in parameters if p.name != model_name) or "nothing"
        raise OptionError(
            f"{{opt:ddp_kwarg}} {unknown[0]}=...: {where} takes no parameter {unknown[0]!r} (besides the model "
            f"it takes: {takes}); drop it or fix the name"
        )


def validate_ddp(impl: Any) -> None:
    """The ddp component's own validation: its ``--ddp-fn`` wrapper, where one is named (:func:`validate_wrapper`)."""
    if impl.ddp_wrapper is not None:
        validate_wrapper(impl.ddp_wrapper)
