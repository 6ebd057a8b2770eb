"""What every DDP rank function shares: the entry point under test, seeded models, devices, copies back.

:func:`parallelizer` hides whether the implementation's entry point is
``DDPManager(config).parallelize(model)`` or ``parallelize_ddp(model,
config)``, or a ``--ddp-fn`` wrapper given the config's fields as keywords
(:class:`WrapperEntryPoint`). A rank function whose entry point did not return a DDP (upstream
in a world of one rank) returns :class:`NotDDP`, and the parent decides
whether that is not applicable or a failure. Inputs and reference copies
follow the wrapped model's device (:func:`device_of`); tensors go back as
CPU copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
from nemo_dist.conformance.engine.errors import ChosenByCode, NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.target import variants_of
from nemo_dist.conformance.suites.ddp.sharded import cpu_copy, grad_copy
from nemo_dist.conformance.suites.ddp.templates import seeded_template
from nemo_dist.conformance.suites.ddp.wrapped import wrap

__all__ = [
    "FunctionEntryPoint",
    "NotDDP",
    "WrapperEntryPoint",
    "cpu_copy",
    "ddp_device_ids",
    "device_indices",
    "device_of",
    "dtype_of",
    "grads_of",
    "local_rows",
    "observe_comm",
    "parallelizer",
    "params_of",
    "resolved_api",
    "seeded",
    "sgd_step",
    "square_loss",
]


@dataclass(frozen=True)
class NotDDP:
    """What a rank function returns when the entry point returned something else than DistributedDataParallel."""

    #: The type name of what the entry point returned.
    returned: str


_M = TypeVar("_M", bound=nn.Module)


def seeded(factory: Callable[[], _M], seed: int, dtype: torch.dtype = torch.float64) -> _M:
    """``factory()`` built under ``torch.manual_seed(seed)`` (the same weights on every rank), cast to ``dtype``.

    Built once per rank and copied after (:func:`~nemo_dist.conformance.suites.ddp.templates.seeded_template`):
    a new object every call, the generator left as building leaves it.
    """
    return seeded_template(factory, seed, dtype)


class FunctionEntryPoint:
    """``parallelize_ddp`` bound to a config, with the manager's ``parallelize(model)`` shape."""

    def __init__(self, function: Callable[..., nn.Module], config: Any) -> None:
        self._function = function
        self.config = config

    def parallelize(self, model: nn.Module) -> nn.Module:
        """``parallelize_ddp(model, config)``."""
        return self._function(model, self.config)


class WrapperEntryPoint:
    """A ``--ddp-fn`` wrapper given the DDP fields of a config, with the manager's ``parallelize(model)`` shape."""

    def __init__(self, wrapper: DDPWrapper, fields: dict[str, Any]) -> None:
        self._wrapper = wrapper
        self._fields = fields

    def parallelize(self, model: nn.Module) -> Any:
        """Wrap ``model``; return the DDP found inside when it drives the model (a proxy's), else what to train.

        A field the wrapper cannot take raises ``NotSupported`` naming it.
        """
        wrapped = wrap(self._wrapper, model, self._fields)
        if wrapped.ddp is not None and wrapped.ddp.module is model:
            return wrapped.ddp
        return wrapped.trained


def resolved_api(impl: Implementation) -> str:
    """The DDP entry point the rank functions use: the pinned one, else ``DDPManager`` when the module has it.

    Raises ``NotSupported`` when the module defines neither.
    """
    apis = variants_of("ddp", impl) or ()
    if not apis:
        raise NotSupported(f"{impl.ddp} defines neither parallelize_ddp nor DDPManager")
    return "DDPManager" if "DDPManager" in apis else apis[0]


def parallelizer(impl: Implementation, config_kwargs: dict[str, Any]) -> Any:
    """The implementation's entry point for a config of ``config_kwargs``: an object with ``parallelize(model)``.

    A ``--ddp-fn`` wrapper gets the config's fields as keywords
    (:func:`~nemo_dist.conformance.suites.ddp.wrapped.field_keywords`).
    """
    if impl.ddp_wrapper is not None:
        return WrapperEntryPoint(impl.ddp_wrapper, dict(config_kwargs))
    config = impl.module("config").DDPConfig(**config_kwargs)
    module = impl.module("ddp")
    if resolved_api(impl) == "DDPManager":
        return module.DDPManager(config)
    return FunctionEntryPoint(module.parallelize_ddp, config)




def observe_comm(ddp: Any, hook: Callable[..., Any]) -> None:
    """Register a check's observing comm ``hook`` on ``ddp``; ``ChosenByCode`` (not applicable) when it has one.

    DDP takes one comm hook: a DDP whose code under test registered its own
    (a float16 compression hook, say) cannot be observed through another.
    """
    try:
        ddp.register_comm_hook(None, hook)
    except RuntimeError as exc:
        if "can only be called once" not in str(exc):
            raise
        raise ChosenByCode(
            "the DDP already has a comm hook (the code under test registered one) and takes no second: its "
            "buckets cannot be observed through the check's own"
        ) from None


def device_of(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter: where its inputs and reference copies go."""
    return next(module.parameters()).device


def dtype_of(module: nn.Module) -> torch.dtype:
    """The dtype of ``module``'s first parameter: inputs and reference copies follow it.

    An entry point may change the model's dtype (upstream casts to bfloat16 in
    a world of one on CUDA); the rank functions then compute in that dtype and
    report it, and the parent compares with that dtype's tolerance.
    """
    return next(module.parameters()).dtype


def ddp_device_ids(device: torch.device) -> list[torch.device] | None:
    """``device_ids`` for a plain DDP on ``device``, as the contract's manager passes them."""
    return [device] if device.type == "cuda" else None


def device_indices(device_ids: Any) -> Any:
    """DDP's ``device_ids`` as plain indices (DDP stores ints; a fork may keep devices); else as is."""
    if not isinstance(device_ids, list):
        return device_ids
    return [d if isinstance(d, int) else torch.device(d).index for d in device_ids]


def local_rows(global_batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """This rank's equal share of ``global_batch``'s rows, on ``device``."""
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = global_batch.shape[0] // size
    return global_batch[rank * rows : (rank + 1) * rows].to(device)


def params_of(model: nn.Module) -> list[torch.Tensor]:
    """CPU copies of ``model``'s parameters."""
    return [cpu_copy(p) for p in model.parameters()]


def grads_of(model: nn.Module) -> list[torch.Tensor | None]:
    """CPU copies of ``model``'s gradients (None where a parameter has none)."""
    return [grad_copy(p, p.grad) for p in model.parameters()]


def sgd_step(model: nn.Module, lr: float) -> None:
    """One plain SGD step, then the gradients cleared."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
            p.grad = None


def square_loss(out: torch.Tensor) -> torch.Tensor:
    """Mean of squares (computed in float32 for a bfloat16 or float16 output)."""
    return out.float().square().mean() if out.dtype in (torch.bfloat16, torch.float16) else out.square().mean()
