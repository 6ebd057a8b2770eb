"""A ``--ddp-fn`` wrapper called one way whatever its shape, and a training step through what it returned.

:func:`wrap` (rank side) moves the model to the rank's device, calls the
wrapper with its ``--ddp-kwarg`` keywords and the DDP fields a check varies
(:func:`field_keywords`: a field the wrapper cannot take is ``NotSupported``,
naming the keyword), picks ``--ddp-output`` out of a tuple, takes a None
return as "changed in place" and finds the ``DistributedDataParallel``
inside what came back (:func:`ddp_inside`: what came back itself, the end of
a ``.module`` chain, or composable ``replicate``'s state). A failure that
says the wrapper needs CUDA or a launcher's environment is raised as
:class:`EnvironmentNeeded`, in one line.

A step runs the declared protocol (:mod:`nemo_dist.conformance.adapters.wrapping`):
:func:`backward` (then the after-backward method on a step that syncs),
:func:`gradients` (``param.grad`` or the declared attribute), :func:`clear`
(the declared zeroing method, and ``param.grad = None``), and
:func:`accumulating` (``no_sync()`` or ``set_requires_gradient_sync(False)``,
where offered).
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.conformance.adapters.symbols import Factory, Symbol
from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.adapters.wrapping import DDP_FIELD_KEYWORDS, accepts, call_arguments, receivers
from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.importing import made, resolve_callable
from nemo_dist.conformance.engine.needs_gpu import gpu_need
from nemo_dist.conformance.suites.ddp.mesh import mesh_form, world_mesh
from nemo_dist.conformance.suites.ddp.sharded import cpu_copy, grad_copy

__all__ = [
    "EnvironmentNeeded",
    "Wrapped",
    "accumulating",
    "backward",
    "call_refused",
    "clear",
    "ddp_inside",
    "environment_need",
    "field_keywords",
    "filled_keywords",
    "gradient_copies",
    "gradients",
    "held",
    "rank_device",
    "sgd",
    "world_devices",
    "wrap",
]

#: nemo_dist's DDPConfig fields that are no DDP keyword: passed only to a wrapper naming them, off values left out.
_OWN_FIELDS_OFF: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "activation_checkpointing": lambda fields: not fields.get("activation_checkpointing"),
    "activation_checkpointing_scope": lambda fields: not fields.get("activation_checkpointing"),
    "autocast_dtype": lambda fields: fields.get("autocast_dtype") is None,
}


class EnvironmentNeeded(RuntimeError):
    """The wrapper failed for what the world lacks (CUDA, a launcher's variable); the message says how to run it."""


@dataclass
class Wrapped:
    """What one call of the wrapper gave on this rank.

    ``model`` is the model passed in (its parameters are what trains);
    ``trained`` what a step calls (what came back, picked; the model when
    None came back); ``returned`` says what came back; ``ddp`` the
    ``DistributedDataParallel`` found inside (None: none) and ``ddp_at``
    where (``"what came back"``, ``".module"``, ``"composable replicate's state"``);
    ``wrapper`` the wrapper and its step protocol; ``params`` the model's
    parameters as wrapping left them: what a trainer's optimizer, built right
    after wrapping, holds and steps. A sharded wrapper may register other
    tensors on the module while it holds the parameters unsharded (FSDP2
    between a forward and a reshard); the steps and reports go through these.
    """

    model: nn.Module
    trained: Any
    returned: str
    ddp: DistributedDataParallel | None
    ddp_at: str
    wrapper: DDPWrapper
    params: tuple[nn.Parameter, ...] = ()


@functools.lru_cache(maxsize=8)
def _callable(spec: str) -> Any:
    return resolve_callable(spec, example="torch.nn.parallel:DistributedDataParallel", what="a function or a class")


def rank_device() -> torch.device:
    """This rank's device: its GPU (``rank % count``) under NCCL with CUDA, else the CPU."""
    return _device_of_rank(dist.get_rank())


def world_devices() -> list[torch.device]:
    """Every rank's device (:func:`rank_device` of each), in rank order."""
    return [_device_of_rank(rank) for rank in range(dist.get_world_size())]


def _device_of_rank(rank: int) -> torch.device:
    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def field_keywords(wrapper: DDPWrapper, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords that pass ``fields`` (DDPConfig field values a check varies) to the wrapper.

    A DDP field goes to a wrapper taking it by name or through ``**kwargs``
    (``bucket_cap_mb=None`` is left out: DDP's default); one of nemo_dist's
    own fields only to a wrapper naming it, and is left out when off.
    Raises ``NotSupported`` naming the keyword the wrapper cannot take.
    """
    takes, _ = receivers(_callable(wrapper.fn), wrapper.method)
    where = f"{wrapper.fn}(...)" if wrapper.method else wrapper.fn
    keywords: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "bucket_cap_mb" and value is None:
            continue
        ddp_field = name in DDP_FIELD_KEYWORDS
        if accepts(takes, name, var_keyword=ddp_field):
            keywords[name] = value
        elif not ddp_field and name in _OWN_FIELDS_OFF and _OWN_FIELDS_OFF[name](fields):
            continue
        else:
            how = "keyword" if ddp_field else "parameter (a DDPConfig field of nemo_dist: **kwargs do not get it)"
            raise NotSupported(f"needs {name}=: {where} takes no {name}= {how}")
    return keywords


def _mesh_value(wrapper: DDPWrapper, keyword: str) -> Any:
    """``@mesh`` in the form the wrapper's ``keyword`` parameter wants (:func:`~.mesh.mesh_form`): the world's
    DeviceMesh, its process group (a 2-D mesh's: the whole world's, every data-parallel rank), or every rank's
    device in rank order."""
    mesh = world_mesh(wrapper.mesh, rank_device().type)
    takes, _ = receivers(_callable(wrapper.fn), wrapper.method)
    parameter = next((p for p in takes or () if p.name == keyword), None)
    form = mesh_form(keyword, parameter)
    if form == "group":
        return mesh.get_group() if mesh.ndim == 1 else dist.group.WORLD
    if form == "devices":
        return world_devices()
    return mesh


def _symbol_value(name: str, wrapper: DDPWrapper, keyword: str) -> Any:
    """What ``@name`` of :data:`~nemo_dist.conformance.adapters.symbols.WRAPPER_SYMBOLS` is here, as ``keyword``."""
    if name == "mesh":
        return _mesh_value(wrapper, keyword)
    if name == "device":
        return rank_device()
    if name == "devices":
        return world_devices()
    if name == "rank":
        return dist.get_rank()
    if name == "world_size":
        return dist.get_world_size()
    raise ValueError(f"unknown symbol @{name}")


def filled_keywords(wrapper: DDPWrapper) -> dict[str, Any]:
    """The wrapper's ``--ddp-kwarg`` keywords filled on this rank: each ``@symbol`` (``@mesh``: the world's mesh, or
    its process group or devices where the parameter wants those;
    ``@device``, ``@devices``, ``@rank``, ``@world_size``) and each ``MODULE:NAME()`` (called once per rank).

    Raises ``NotApplicable`` where this world cannot hold the ``--ddp-mesh`` mesh.
    """
    keywords = wrapper.call_kwargs()
    for name, value in keywords.items():
        if isinstance(value, Symbol):
            keywords[name] = _symbol_value(value.name, wrapper, name)
        elif isinstance(value, Factory):
            keywords[name] = made(value.path)
    return keywords


def _picked(out: Any, wrapper: DDPWrapper) -> Any:
    if wrapper.output is None:
        return out
    if not isinstance(out, (tuple, list)) or wrapper.output >= len(out):
        what = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise TypeError(
            f"{wrapper.fn} returned {what}: --ddp-output {wrapper.output} picks an element of a tuple or list "
            "return; give the index of the wrapped model, or leave --ddp-output out"
        )
    return out[wrapper.output]


def call_refused(exc: BaseException) -> str:
    """``Type: message`` when ``exc`` is Python refusing the call's arguments (no frame of the callee ran), else ""."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, TypeError) and frames and frames[-1].filename == __file__:
        return f"TypeError: {str(exc).strip()}"
    return ""


def environment_need(exc: BaseException, wrapper: DDPWrapper) -> str:
    """One line saying what the world lacks when ``exc`` shows the wrapper needs CUDA or a launcher variable, or "".

    CUDA: outside an nccl world, when :func:`~nemo_dist.conformance.engine.needs_gpu.gpu_need` finds evidence
    in ``exc``.
    """
    key = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(key, str) and key not in os.environ and any("environ" in (f.line or "") for f in frames):
        return (
            f"{wrapper.fn} reads the environment variable {key}, which this world does not set (it sets "
            "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); set it, or run the tool "
            "inside the launcher that sets it (with RANK, WORLD_SIZE and MASTER_ADDR set too, the tool joins that "
            "world, as under torchrun)"
        )
    backend = str(dist.get_backend()) if dist.is_initialized() else "none"
    if "nccl" not in backend and gpu_need(exc):
        first = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
        return (
            f"{wrapper.fn} needs CUDA ({first}); run with the nccl backend on a machine with GPUs "
            "(--backend nccl; under pytest --conformance-backend nccl)"
        )
    return ""


def wrap(wrapper: DDPWrapper, model: nn.Module, fields: Mapping[str, Any] | None = None) -> Wrapped:
    """Move ``model`` to this rank's device and wrap it as ``wrapper`` says, with the keywords of ``fields``.

    Raises ``NotSupported`` for a field the wrapper cannot take, ``NotApplicable``
    where this world cannot hold the ``--ddp-mesh`` mesh,
    :class:`EnvironmentNeeded` when its failure says the world lacks CUDA or
    a launcher's variable, and what the wrapper raises otherwise.
    """
    found = _callable(wrapper.fn)
    keywords = {**filled_keywords(wrapper), **field_keywords(wrapper, fields or {})}
    model = model.to(rank_device())
    try:
        if wrapper.method is not None:
            out = getattr(found(**keywords), wrapper.method)(model)
        else:
            args, kwargs = call_arguments(receivers(found, None)[1], model, keywords)
            out = found(*args, **kwargs)
    except Exception as exc:
        need = environment_need(exc, wrapper)
        if need:
            raise EnvironmentNeeded(need) from exc
        raise
    out = _picked(out, wrapper)
    trained = model if out is None else out
    ddp, at = ddp_inside(trained, model)
    if out is None:
        returned = "None (the model changed in place)"
    elif out is model:
        returned = f"the model itself ({type(model).__name__})"
    else:
        returned = type(out).__name__
    return Wrapped(model, trained, returned, ddp, at, wrapper, tuple(model.parameters()))


def _replicate_ddp(module: Any) -> DistributedDataParallel | None:
    """The DDP composable ``replicate`` keeps in ``module``'s state (built at its first forward), or None."""
    try:
        from torch.distributed._composable.contract import _get_registry
        from torch.distributed._composable.replicate import replicate
    except ImportError:  # another torch: no composable replicate to look into
        return None
    if not isinstance(module, nn.Module) or "replicate" not in (_get_registry(module) or {}):
        return None
    ddp = getattr(replicate.state(module), "_ddp", None)
    return ddp if isinstance(ddp, DistributedDataParallel) else None


def ddp_inside(obj: Any, model: nn.Module) -> tuple[DistributedDataParallel | None, str]:
    """The ``DistributedDataParallel`` in ``obj`` (itself, at the end of a ``.module`` chain, or in replicate's state).

    Returns the DDP and where it was found, or ``(None, "")``.
    """
    current, path, seen = obj, "", set()
    while current is not None and id(current) not in seen:
        if isinstance(current, DistributedDataParallel):
            return current, path or "what came back"
        seen.add(id(current))
        # A module's submodule only: a proxy's __getattr__ may answer any name.
        current = current._modules.get("module") if isinstance(current, nn.Module) else getattr(current, "module", None)
        path += ".module"
    for candidate in (obj, model):
        ddp = _replicate_ddp(candidate)
        if ddp is not None:
            return ddp, "composable replicate's state"
    return None, ""


def backward(wrapped: Wrapped, loss: torch.Tensor, *, sync: bool = True) -> None:
    """``loss.backward()``, then the declared after-backward method when this step syncs."""
    loss.backward()
    if sync and wrapped.wrapper.after_backward is not None:
        getattr(wrapped.trained, wrapped.wrapper.after_backward)()


def gradients(wrapped: Wrapped) -> list[torch.Tensor | None]:
    """The gradients of ``wrapped.params`` as the wrapper leaves them (``param.grad``, or the declared attribute)."""
    name = wrapped.wrapper.grad_attr
    return [p.grad if name is None else getattr(p, name, None) for p in wrapped.params]


def gradient_copies(wrapped: Wrapped) -> list[torch.Tensor | None]:
    """CPU copies of :func:`gradients`, whole where sharded (None where this rank holds none): a collective for
    each DTensor parameter on every rank, whether or not its shard got a gradient here."""
    return [grad_copy(param, grad) for param, grad in zip(wrapped.params, gradients(wrapped), strict=True)]


def held(wrapped: Wrapped) -> list[torch.Tensor]:
    """CPU copies of ``wrapped.params`` (whole where sharded): the weights a trainer's optimizer holds."""
    return [cpu_copy(p) for p in wrapped.params]


def clear(wrapped: Wrapped) -> None:
    """The declared zeroing method, then ``param.grad = None`` for every parameter (held, or registered now)."""
    if wrapped.wrapper.zero_grad is not None:
        getattr(wrapped.trained, wrapped.wrapper.zero_grad)()
    for p in (*wrapped.params, *wrapped.model.parameters()):
        p.grad = None


def sgd(wrapped: Wrapped, lr: float) -> None:
    """One plain SGD step of ``wrapped.params`` on :func:`gradients`, then :func:`clear`."""
    with torch.no_grad():
        for p, g in zip(wrapped.params, gradients(wrapped), strict=True):
            if g is not None:
                p.sub_(lr * g.to(p.dtype))
    clear(wrapped)


def accumulating(wrapped: Wrapped) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
    """A context in which backward accumulates without syncing (``no_sync()``, or ``set_requires_gradient_sync``).

    None when what came back offers neither.
    """
    trained = wrapped.trained
    if callable(getattr(trained, "no_sync", None)):
        return trained.no_sync
    if callable(getattr(trained, "set_requires_gradient_sync", None)):
        return functools.partial(_gradient_sync_off, trained)
    return None


@contextlib.contextmanager
def _gradient_sync_off(module: Any) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
