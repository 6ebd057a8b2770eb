"""Seeded models built once per rank and handed out as fresh copies.

A check builds the same seeded model many times on a rank: once per scope,
mode and example, and once more for the unwrapped reference. Building runs
every ``__init__`` and every initialiser; ``copy.deepcopy`` walks every
hook dictionary of every module. :func:`fresh_copy` copies what a wrapper
may change (each module object, its parameters, buffers, children and
containers) and shares what none changes (the hooks dictionaries are copied
empty or shallow, immutable values are shared), so a copy costs a fraction
of either.

:func:`seeded_template` keeps one built model per ``(factory, seed, dtype)``
together with the random-number state its building left behind, so that a
caller sees the same weights and the same generator state as if it had
built the model itself. :func:`manual_seed` seeds as ``torch.manual_seed``
does, at a fraction of its cost on a machine without accelerators.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["fresh_copy", "manual_seed", "seeded_template"]

_M = TypeVar("_M", bound=nn.Module)

#: Values shared between a model and its copy: nothing a wrapper can change in place.
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, type, torch.dtype, torch.device)

#: Container types whose empty instances are copied by calling the type.
_EMPTY_CONTAINERS = frozenset({dict, OrderedDict, list, set})

#: Built models by (factory, seed, dtype), with the generator state building them left.
_TEMPLATES: dict[tuple[Any, int, torch.dtype], tuple[nn.Module, torch.Tensor]] = {}


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    if isinstance(value, nn.Module):
        return _copy_module(value, memo)
    if isinstance(value, _IMMUTABLE):
        return value
    if type(value) in _EMPTY_CONTAINERS and not value:  # a module's many hook dictionaries, mostly
        return type(value)()
    return copy.deepcopy(value, memo)


def _copy_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    if id(module) in memo:
        return memo[id(module)]
    if hasattr(type(module), "__deepcopy__"):  # a module that says how it is copied is copied its way
        return copy.deepcopy(module, memo)
    new = object.__new__(type(module))
    memo[id(module)] = new
    state = {}
    for name, value in module.__dict__.items():
        if name == "_modules":
            state[name] = {key: None if child is None else _copy_module(child, memo) for key, child in value.items()}
        elif name in ("_parameters", "_buffers"):
            state[name] = {key: None if t is None else copy.deepcopy(t, memo) for key, t in value.items()}
        else:
            state[name] = _copy_value(value, memo)
    new.__dict__.update(state)
    return new


def fresh_copy(module: _M) -> _M:
    """A copy of ``module`` that behaves as ``copy.deepcopy(module)`` for anything a wrapper or training changes.

    Every module of the tree, parameter (tied ones stay tied), buffer and
    mutable attribute is copied; immutable attributes are shared. The copy
    keeps the parameters' ``requires_grad`` and carries no gradients that
    ``module`` has none of.
    """
    copied = _copy_module(module, {})
    assert isinstance(copied, type(module))
    return copied


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``, without queueing the seeding of accelerators this process cannot use.

    Where CUDA, XPU and MTIA are all unavailable (and no other device backend
    is registered) only the CPU generator is seeded: ``torch.manual_seed``
    would also queue each accelerator's lazy seeding, formatting the whole
    Python stack three times (about 0.5 ms deep inside a rank). Anywhere else
    it is ``torch.manual_seed`` itself.
    """
    if _accelerator_seeding_needed():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _accelerator_seeding_needed() -> bool:
    return (
        torch.cuda.is_available()
        or torch.xpu.is_available()
        or torch.mtia.is_available()
        or torch._C._get_privateuse1_backend_name() != "privateuseone"
    )


def seeded_template(factory: Callable[[], _M], seed: int, dtype: torch.dtype) -> _M:
    """A fresh copy of ``factory()`` built under ``torch.manual_seed(seed)`` and cast to ``dtype``.

    The model is built once per process and key; each call returns a
    :func:`fresh_copy` and leaves the global generator in the state the
    building left it, as building anew would.
    """
    key = (factory, seed, dtype)
    if key not in _TEMPLATES:
        manual_seed(seed)
        _TEMPLATES[key] = (factory().to(dtype), torch.get_rng_state())
    template, rng_state = _TEMPLATES[key]
    torch.set_rng_state(rng_state)
    return fresh_copy(template)  # type: ignore[return-value]  # the template is what factory() built
