"""The gather under test, called one way whatever its shape: :class:`GatherTarget`.

A target is either a dist_utils-style module (``all_gather_with_grad`` and
``all_gather_no_grad``) or one callable found anywhere: a function, a
``torch.autograd.Function`` subclass (called through ``.apply``) or another
class (an ``nn.Module``, say: built once per rank with the ``--gather-init``
keywords, then the object called), whose
output is the concatenation on dim 0, a tuple or list of W tensors, or a
stacked ``[W, *x.shape]`` tensor, or a tuple holding one of those
(``--gather-output`` picks it). :meth:`GatherTarget.gather` calls it (with the
``--gather-kwarg`` keywords) and returns the concatenation, so every check
asserts on one form; a tuple form that is not W tensors is a ``TypeError``
saying so, never concatenated. Whether a callable takes a process group
(keyword, or the parameter after ``x``) or ``uneven=`` is read from its
signature, per callable; a call without a subgroup passes a group parameter
that has no default the whole world's group, and a ``--gather-kwarg`` given
as ``@group`` names the group parameter whatever its name. Symbols are
filled and async results waited on per call (:mod:`.calls`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dist.conformance.adapters import signature
from nemo_dist.conformance.adapters.gather_spec import call_kwargs, init_kwargs
from nemo_dist.conformance.adapters.signature import GROUP_PARAMETERS
from nemo_dist.conformance.adapters.symbols import Symbol
from nemo_dist.conformance.engine.errors import NotApplicable, NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.suites.gather.calls import filled, landed, world_group

__all__ = ["GROUP_PARAMETERS", "GatherTarget", "describe", "detect_form", "target"]


def detect_form(out: Any, x: torch.Tensor) -> str:
    """The output form of one call: "tuple" (tuple or list), "stacked" (one more dim than ``x``) or "cat"."""
    if isinstance(out, (tuple, list)):
        return "tuple"
    if isinstance(out, torch.Tensor) and out.dim() == x.dim() + 1:
        return "stacked"
    return "cat"


def describe(value: Any) -> str:
    """What a call returned, in words: "shape (2,)", "a tuple of 2 tensors of shape ()", "None" ..."""
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)}"
    if not isinstance(value, (tuple, list)):
        return "None" if value is None else f"a value of type {type(value).__name__}"
    kind, n = type(value).__name__, len(value)
    if not value:
        return f"an empty {kind}"
    if not all(isinstance(v, torch.Tensor) for v in value):
        items = [
            f"tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__ for v in value
        ]
        return f"a {kind} of {n} ({', '.join(items)})"
    shapes = [tuple(v.shape) for v in value]
    tensors = "tensor" if n == 1 else "tensors"
    if len(set(shapes)) == 1:
        return f"a {kind} of {n} {tensors} of shape {shapes[0]}"
    return f"a {kind} of {n} {tensors} of shapes {', '.join(map(str, shapes))}"


def _kinds(items: Any) -> str:
    return ", ".join(type(item).__name__ for item in items)


def _picked(out: Any, index: int | None, name: str) -> Any:
    """The element ``index`` of a tuple or list return (``out`` itself when no index is given)."""
    if index is None:
        return out
    if not isinstance(out, (tuple, list)):
        raise TypeError(
            f"{name} returned a {type(out).__name__}, not a tuple or list: --gather-output {index} picks an "
            "element of a tuple or list return; leave --gather-output out"
        )
    if index >= len(out):
        raise TypeError(
            f"{name} returned a {type(out).__name__} of {len(out)} ({_kinds(out)}): --gather-output {index} is "
            f"past its end; give the index of the gathered tensor (0..{len(out) - 1})"
        )
    return out[index]


def _extra_hint(parts: Any) -> str:
    """How to pick the gathered tensor out of a ``(gathered, extra)`` return, for a tuple that is not W tensors."""
    first = next((i for i, p in enumerate(parts) if isinstance(p, torch.Tensor)), 0)
    return f"a (gathered, extra) return needs --gather-output {first}"


def _parts(out: Any, x: torch.Tensor, name: str, world_size: int | None) -> list[torch.Tensor]:
    """The W tensors of a tuple-form return; a ``TypeError`` saying why when it is not W tensors."""
    kind = type(out).__name__
    parts = list(out) if isinstance(out, (tuple, list)) else None
    if parts is None:
        raise TypeError(f"{name} returned {kind}; the tuple form expects a tuple of W tensors")
    tensors = all(isinstance(p, torch.Tensor) for p in parts)
    what = f"{len(parts)} tensors" if tensors else f"{len(parts)} items ({_kinds(parts)})"
    if world_size is not None and len(parts) != world_size:
        raise TypeError(
            f"{name} returned a {kind} of {what} at world size {world_size}; the tuple form needs one tensor "
            f"per rank; {_extra_hint(parts)}"
        )
    if not parts or not tensors:
        raise TypeError(f"{name} returned a {kind} of {what}; the tuple form needs W tensors; {_extra_hint(parts)}")
    if x.dim() == 0:
        raise TypeError(
            f"{name} returned a {kind} of {what} for a 0-d x; 0-d tensors have no dim 0 to concatenate on"
        )
    if any(p.dim() != x.dim() or p.shape[1:] != x.shape[1:] for p in parts):
        shapes = ", ".join(str(tuple(p.shape)) for p in parts)
        raise TypeError(
            f"{name} returned a {kind} of {what} of shapes {shapes} for x of shape {tuple(x.shape)}; the tuple "
            f"form needs each rank's x; {_extra_hint(parts)}"
        )
    return parts


def _as_cat(
    out: Any, x: torch.Tensor, form: str, name: str, world_size: int | None = None, index: int | None = None
) -> torch.Tensor:
    """The concatenation ``out`` stands for (after picking element ``index``); ``TypeError`` when it is none."""
    out = _picked(out, index, name)
    form = detect_form(out, x) if form == "auto" else form
    if form == "tuple":
        return torch.cat(_parts(out, x, name, world_size), dim=0)
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"{name} returned {type(out).__name__}; expected a tensor (concatenation or stacked) or a tuple of tensors"
        )
    if form == "stacked":
        if x.dim() == 0:
            raise TypeError(
                f"{name} returned shape {tuple(out.shape)} for a 0-d x; 0-d tensors have no dim 0 to concatenate on"
            )
        if out.dim() < 2:
            raise TypeError(
                f"{name} returned shape {tuple(out.shape)} for x of shape {tuple(x.shape)}; the stacked form "
                "needs [W, *x.shape]"
            )
        return out.flatten(0, 1)
    return out


def _group_size(group: Any) -> int | None:
    """The number of ranks a call gathers from (None outside a process group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_world_size(group))


@dataclass(frozen=True)
class _Signature:
    group: str | None  # the parameter name, or None
    uneven: bool
    function_class: bool  # called through .apply: every value is placed by position
    parameters: tuple[inspect.Parameter, ...] | None  # after x; None when unreadable
    group_required: bool = False  # the group parameter has no default: a call without a subgroup passes the world's


def _signature(found: Any, *, allow_var_keyword: bool, keywords: dict[str, Any] | None = None) -> _Signature:
    """What ``found`` (a function, an autograd Function's class, a class built then called) accepts besides ``x``.

    A keyword of ``keywords`` given as ``@group`` is the group parameter.
    """
    function_class = signature.is_function_class(found)
    rest = signature.parameters_after_x(found)
    symbol_group = next((k for k, v in (keywords or {}).items() if v == Symbol("group")), None)
    if rest is None:
        return _Signature(symbol_group, False, function_class, None)
    named = {p.name: p for p in rest}
    var_keyword = allow_var_keyword and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest)
    group = symbol_group or next((n for n in GROUP_PARAMETERS if n in named), None)
    if group is None and var_keyword:
        group = "group"
    required = group in named and named[group].default is inspect.Parameter.empty and symbol_group is None
    # apply() passes positional arguments only, so uneven= cannot reach an autograd Function's forward.
    uneven = not function_class and ("uneven" in named or var_keyword)
    return _Signature(group, uneven, function_class, rest, required)


@dataclass(frozen=True)
class GatherTarget:
    """One gather implementation, called as ``gather(x, no_grad=..., group=..., uneven=...)``.

    ``label`` names it in messages; ``module_api`` is True for a dist_utils
    module (whose ``all_gather_with_grad`` also promises to return ``x`` when
    there is nothing to gather); ``form`` is the output form ("auto":
    detected from each result); ``keywords`` are passed on every call
    (``--gather-kwarg``) and ``output`` picks the gathered value out of a
    tuple or list return (``--gather-output``).
    """

    label: str
    module_api: bool
    form: str
    _with_grad: Callable[..., Any]
    _no_grad: Callable[..., Any] | None
    _with_grad_signature: _Signature
    _no_grad_signature: _Signature
    keywords: tuple[tuple[str, Any], ...] = ()
    output: int | None = None

    def takes(self, keyword: str) -> bool:
        """Whether both callables accept ``keyword`` ("group" or "uneven")."""
        signatures = [self._with_grad_signature, self._no_grad_signature]
        if keyword == "group":
            return all(s.group is not None for s in signatures)
        return all(s.uneven for s in signatures)

    def require(self, keyword: str) -> None:
        """Raise ``NotSupported`` (saying what the check needs) unless the target takes ``keyword``."""
        if not self.takes(keyword):
            how = "keyword or parameter after x" if keyword == "group" else "keyword"
            raise NotSupported(f"needs {keyword}=: {self.label} takes no {keyword}= {how}")

    def require_module(self, promise: str) -> None:
        """Raise ``NotApplicable`` unless the target is a dist_utils module (``promise`` says what is checked)."""
        if not self.module_api:
            raise NotApplicable(
                f"{promise} is a promise of a dist_utils module's all_gather_with_grad; "
                f"{self.label} is checked as a bare collective"
            )

    def first_call(self, x: torch.Tensor) -> str:
        """Call the with-grad callable once on ``x``; return the form of its gathered value.

        Raises what the call raises, and a ``TypeError`` when the value is
        no gathered form (a tuple that is not W tensors, say).
        """
        out = _picked(self._call(self._with_grad, self._with_grad_signature, x, {}, None), self.output, self.label)
        form = detect_form(out, x) if self.form == "auto" else self.form
        _as_cat(out, x, form, self.label, _group_size(None))
        return form

    def gather(
        self, x: torch.Tensor, *, no_grad: bool = False, group: Any = None, uneven: bool = False
    ) -> torch.Tensor:
        """Call the target on ``x`` and return the concatenation of every rank's rows.

        With ``no_grad`` and no separate no-grad callable, the call and the
        concatenation of a returned tuple or list both run under ``torch.no_grad()``.
        """
        name, context, call = self._prepared(x, no_grad, group, uneven)
        with context:
            # Combining a returned list is part of the call: under the call's grad mode, or a
            # list holding x itself (which requires grad) would concatenate into autograd.
            return _as_cat(call(), x, self.form, name, _group_size(group), self.output)

    def returned(self, x: Any, *, no_grad: bool = False, group: Any = None, uneven: bool = False) -> Any:
        """Call the target on ``x`` as :meth:`gather` does; return what the callable returned, not combined.

        Raises what the call raises, never an error of combining its value
        (:func:`describe` puts the value in words).
        """
        _, context, call = self._prepared(x, no_grad, group, uneven)
        with context:
            return call()

    def _prepared(
        self, x: Any, no_grad: bool, group: Any, uneven: bool
    ) -> tuple[str, contextlib.AbstractContextManager[Any], Callable[[], Any]]:
        """The callable's name in messages, the grad mode to call it under, and the call itself."""
        if no_grad and self._no_grad is not None:
            fn, sig, name = self._no_grad, self._no_grad_signature, f"{self.label} (no grad)"
        else:
            fn, sig, name = self._with_grad, self._with_grad_signature, self.label
        values: dict[str, Any] = {}
        if group is not None:
            if sig.group is None:
                raise NotSupported(f"needs group=: {name} takes no group=")
            values[sig.group] = group
        if uneven:
            values["uneven"] = True
        context = torch.no_grad() if no_grad and self._no_grad is None else contextlib.nullcontext()
        return name, context, lambda: self._call(fn, sig, x, values, group)

    def _call(
        self, fn: Callable[..., Any], sig: _Signature, x: torch.Tensor, values: dict[str, Any], group: Any
    ) -> Any:
        """``fn(x, ...)`` with ``values`` and this target's keywords, each placed as ``fn`` takes it.

        Symbols are filled for a call over ``group`` (None: the whole world), a
        required group parameter no check fills gets the world's group, and
        the result is waited on (:func:`~.calls.landed`).
        """
        given = {**dict(self.keywords), **values}
        if sig.group_required and sig.group is not None and sig.group not in given:
            given[sig.group] = world_group()
        args, kwargs = signature.arguments(sig.parameters, filled(given, x, group), sig.function_class)
        return landed(fn(x, *args, **kwargs))


def _callable(spec: str, impl: Implementation) -> tuple[Callable[..., Any], _Signature]:
    """The callable ``spec`` names (a class built with ``impl``'s ``--gather-init`` keywords) and its signature."""
    found = resolve_callable(spec)
    sig = _signature(found, allow_var_keyword=False, keywords=call_kwargs(impl))
    if signature.is_built_class(found):
        return _Built(found, impl), sig
    return (found.apply if sig.function_class else found), sig


class _Built:
    """A class built on its first call (on a rank, where the process group exists), then its object called.

    Built with ``--gather-init``'s keywords, symbols filled for the whole
    world; a required group parameter gets the world's group.
    """

    def __init__(self, cls: type, impl: Implementation) -> None:
        self._cls, self._impl = cls, impl
        self._object: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._object is None:
            values = init_kwargs(self._impl)
            try:
                parameters = dict(inspect.signature(self._cls).parameters)
            except (TypeError, ValueError):
                parameters = {}
            for name in GROUP_PARAMETERS:
                if name in parameters and parameters[name].default is inspect.Parameter.empty and name not in values:
                    values[name] = Symbol("group")
            self._object = self._cls(**filled(values, None, None))
        return self._object(*args, **kwargs)


@functools.lru_cache(maxsize=16)
def target(impl: Implementation) -> GatherTarget:
    """The :class:`GatherTarget` of ``impl`` (cached per implementation; imports what it names)."""
    if impl.gather_fn is not None:
        with_grad, with_signature = _callable(impl.gather_fn, impl)
        if impl.no_grad_fn is not None:
            no_grad, no_grad_signature = _callable(impl.no_grad_fn, impl)
        else:
            no_grad, no_grad_signature = None, with_signature
        return GatherTarget(
            impl.gather_fn,
            False,
            impl.gather_form,
            with_grad,
            no_grad,
            with_signature,
            no_grad_signature,
            tuple(call_kwargs(impl).items()),
            impl.gather_output,
        )
    module = impl.module("gather")
    with_grad = module.all_gather_with_grad
    no_grad = module.all_gather_no_grad
    return GatherTarget(
        f"{impl.gather}.all_gather_with_grad",
        True,
        "cat",
        with_grad,
        no_grad,
        _signature(with_grad, allow_var_keyword=True),
        _signature(no_grad, allow_var_keyword=True),
    )
