"""The gather under test, called one way whatever its shape: :class:`GatherTarget`.

A target is either a dist_utils-style module (``all_gather_with_grad`` and
``all_gather_no_grad``) or one callable found anywhere: a function or a
``torch.autograd.Function`` subclass (called through ``.apply``), whose
output is the concatenation on dim 0, a tuple or list of W tensors, or a
stacked ``[W, *x.shape]`` tensor. :meth:`GatherTarget.gather` calls it and
returns the concatenation, so every check asserts on one form. Whether a
callable takes a process group (keyword, or the parameter after ``x``) or
``uneven=`` is read from its signature, per callable.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dist.conformance.target import Implementation, NotApplicable, NotSupported, resolve_callable

__all__ = ["GROUP_PARAMETERS", "GatherTarget", "detect_form", "target"]

#: Parameter names taken to be a process group.
GROUP_PARAMETERS: tuple[str, ...] = ("group", "process_group", "pg")


def detect_form(out: Any, x: torch.Tensor) -> str:
    """The output form of one call: "tuple" (tuple or list), "stacked" (one more dim than ``x``) or "cat"."""
    if isinstance(out, (tuple, list)):
        return "tuple"
    if isinstance(out, torch.Tensor) and out.dim() == x.dim() + 1:
        return "stacked"
    return "cat"


def _as_cat(out: Any, x: torch.Tensor, form: str, name: str) -> torch.Tensor:
    form = detect_form(out, x) if form == "auto" else form
    if form == "tuple":
        parts = list(out) if isinstance(out, (tuple, list)) else None
        if not parts or not all(isinstance(p, torch.Tensor) for p in parts):
            raise TypeError(f"{name} returned {type(out).__name__}; the tuple form expects a tuple of W tensors")
        return torch.cat(parts, dim=0)
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"{name} returned {type(out).__name__}; expected a tensor (concatenation or stacked) or a tuple of tensors"
        )
    if form == "stacked":
        if out.dim() < 2:
            raise TypeError(f"{name} returned shape {tuple(out.shape)}; the stacked form needs [W, *x.shape]")
        return out.flatten(0, 1)
    return out


@dataclass(frozen=True)
class _Signature:
    group: str | None  # the parameter name, or None
    group_positional: bool
    uneven: bool


def _signature(fn: Callable[..., Any], *, skip: int, allow_var_keyword: bool) -> _Signature:
    """What ``fn`` accepts besides ``x``: its first ``skip`` parameters (ctx, x) are not looked at."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return _Signature(None, False, False)
    rest = parameters[skip:]
    named = {p.name: p for p in rest}
    var_keyword = allow_var_keyword and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest)
    group = next((n for n in GROUP_PARAMETERS if n in named), None)
    positional = False
    if group is not None:
        kind = named[group].kind
        positional = kind is inspect.Parameter.POSITIONAL_ONLY
    elif var_keyword:
        group = "group"
    uneven = "uneven" in named or var_keyword
    return _Signature(group, positional, uneven)


@dataclass(frozen=True)
class GatherTarget:
    """One gather implementation, called as ``gather(x, no_grad=..., group=..., uneven=...)``.

    ``label`` names it in messages; ``module_api`` is True for a dist_utils
    module (whose ``all_gather_with_grad`` also promises to return ``x`` when
    there is nothing to gather); ``form`` is the output form ("auto":
    detected from each result).
    """

    label: str
    module_api: bool
    form: str
    _with_grad: Callable[..., Any]
    _no_grad: Callable[..., Any] | None
    _with_grad_signature: _Signature
    _no_grad_signature: _Signature
    _is_function_class: bool

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

    def form_of_call(self, x: torch.Tensor) -> str:
        """Call the with-grad callable once on ``x`` and return the form of what it returned."""
        return detect_form(self._with_grad(x), x)

    def gather(
        self, x: torch.Tensor, *, no_grad: bool = False, group: Any = None, uneven: bool = False
    ) -> torch.Tensor:
        """Call the target on ``x`` and return the concatenation of every rank's rows.

        With ``no_grad`` and no separate no-grad callable, the call and the
        concatenation of a returned tuple or list both run under ``torch.no_grad()``.
        """
        if no_grad and self._no_grad is not None:
            fn, signature, name = self._no_grad, self._no_grad_signature, f"{self.label} (no grad)"
        else:
            fn, signature, name = self._with_grad, self._with_grad_signature, self.label
        args: list[Any] = [x]
        kwargs: dict[str, Any] = {}
        if group is not None:
            if signature.group is None:
                raise NotSupported(f"needs group=: {name} takes no group=")
            if self._is_function_class or signature.group_positional:
                args.append(group)
            else:
                kwargs[signature.group] = group
        if uneven:
            kwargs["uneven"] = True
        context = torch.no_grad() if no_grad and self._no_grad is None else contextlib.nullcontext()
        with context:
            # Combining a returned list is part of the call: under the call's grad mode, or a
            # list holding x itself (which requires grad) would concatenate into autograd.
            return _as_cat(fn(*args, **kwargs), x, self.form, name)


def _callable(spec: str) -> tuple[Callable[..., Any], _Signature, bool]:
    found = resolve_callable(spec)
    if isinstance(found, type) and issubclass(found, torch.autograd.Function):
        signature = _signature(found.forward, skip=2, allow_var_keyword=False)
        # apply() takes positional arguments only, and uneven= cannot reach forward.
        return found.apply, _Signature(signature.group, True, False), True
    return found, _signature(found, skip=1, allow_var_keyword=False), False


@functools.lru_cache(maxsize=16)
def target(impl: Implementation) -> GatherTarget:
    """The :class:`GatherTarget` of ``impl`` (cached per implementation; imports what it names)."""
    if impl.gather_fn is not None:
        with_grad, with_signature, is_class = _callable(impl.gather_fn)
        if impl.no_grad_fn is not None:
            no_grad, no_grad_signature, _ = _callable(impl.no_grad_fn)
        else:
            no_grad, no_grad_signature = None, with_signature
        return GatherTarget(
            impl.gather_fn, False, impl.gather_form, with_grad, no_grad, with_signature, no_grad_signature, is_class
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
        _signature(with_grad, skip=1, allow_var_keyword=True),
        _signature(no_grad, skip=1, allow_var_keyword=True),
        False,
    )
