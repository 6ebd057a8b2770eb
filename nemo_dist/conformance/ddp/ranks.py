"""Rank-side functions of the DDP checks but the training ones: what the entry point builds, each field's effect.

Every public function here runs on every rank of a world (through
``World.run``), takes an ``Implementation`` and plain data, builds its models
(:mod:`~nemo_dist.conformance.ddp.models`) with ``torch.manual_seed`` so all
ranks start equal, and returns plain data (CPU tensors, ints, bools, strings)
for the parent to assert on: the manager's attributes, where the wrapped
model lives, buffers, buckets, an unused parameter, gradients aliasing the
buckets, recomputation under checkpointing, the autocast dtype, and the
world setup :func:`warm_up`. The functions that train through the entry
point and compare with a reference run are in
:mod:`~nemo_dist.conformance.ddp.training`.

The entry point is the one the implementation pins (``impl.ddp_api``):
``DDPManager(config).parallelize(model)`` or ``parallelize_ddp(model,
config)``; :func:`~nemo_dist.conformance.ddp.entry_point.parallelizer` hides
the difference. Upstream returns the model unwrapped in a world of one rank;
functions that need the DDP object then return
:class:`~nemo_dist.conformance.ddp.entry_point.NotDDP` (or report
``"is_ddp"``) and leave it to the parent to call that not applicable.

Device: models are built on CPU and the entry point moves them to the
rank's device (the rank's GPU under NCCL, else CPU).  Inputs follow the
wrapped model's parameters (so does the plain DDP :func:`bucket_layouts`
compares with), and every tensor returned goes back as a CPU copy, so the
same functions run in gloo and NCCL worlds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.conformance.ddp.entry_point import (
    NotDDP,
    ddp_device_ids,
    device_indices,
    device_of,
    dtype_of,
    grads_of,
    local_rows,
    observe_comm,
    parallelizer,
    params_of,
    seeded,
    sgd_step,
    square_loss,
)
from nemo_dist.conformance.ddp.models import (
    DIM,
    _Buffered,
    _MultimodalModel,
    _SometimesUnused,
    _TinyModel,
    bucket_model,
    multimodal_blocks,
)
from nemo_dist.conformance.target import Implementation

__all__ = [
    "CONFIG_FIELDS",
    "autocast_output_dtype",
    "bucket_layouts",
    "buffer_sync",
    "checkpoint_recompute",
    "grad_bucket_aliasing",
    "manager_attributes",
    "placement",
    "requires_process_group",
    "unused_parameter",
    "warm_up",
]

#: The seven config fields the manager mirrors as attributes (plus autocast_dtype in the config).
CONFIG_FIELDS = (
    "activation_checkpointing",
    "activation_checkpointing_scope",
    "broadcast_buffers",
    "find_unused_parameters",
    "static_graph",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
)

_M = TypeVar("_M")


def _with_other_current_gpu(call: Callable[[], _M]) -> tuple[_M, int | None]:
    """``call()`` with another GPU made current first (when NCCL has two or more); the current device after it.

    Shows that the entry point itself makes its GPU current; the previous
    current device is restored afterwards. On gloo nothing touches CUDA.
    """
    backend = str(dist.get_backend())
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    watch_cuda = "nccl" in backend and cuda_count > 0
    original = torch.cuda.current_device() if watch_cuda else None
    try:
        if watch_cuda and cuda_count > 1:
            torch.cuda.set_device((dist.get_rank() + 1) % cuda_count)
        value = call()
        current = torch.cuda.current_device() if watch_cuda else None
    finally:
        if original is not None:
            torch.cuda.set_device(original)
    return value, current


def manager_attributes(impl: Implementation, config_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Build a ``DDPManager``; report its rank, world size, device and each config field it mirrors."""
    config = impl.module("config").DDPConfig(**config_kwargs)
    manager, current = _with_other_current_gpu(lambda: impl.module("ddp").DDPManager(config))
    return {
        "rank": (manager.rank, dist.get_rank()),
        "world_size": (manager.world_size, dist.get_world_size()),
        "device": str(getattr(manager, "device", "<missing>")),
        "current_device": current,
        "mirrored": {f: (getattr(manager, f, "<missing>"), getattr(config, f)) for f in CONFIG_FIELDS},
    }


def placement(impl: Implementation, config_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Wrap a tiny float64 model through the entry point; report what came back and where it lives.

    Returns the backend, the number of visible GPUs (0 without CUDA), whether
    the result is a DDP whose ``.module`` is the model or the model itself,
    the devices and dtypes of its parameters, the DDP's ``device_ids`` (DDP
    stores indices: ints; None when not a DDP) and, under CUDA, the current
    CUDA device after the entry point ran.
    """
    model = seeded(_TinyModel, 0)
    wrapped, current = _with_other_current_gpu(lambda: parallelizer(impl, config_kwargs).parallelize(model))
    is_ddp = isinstance(wrapped, DistributedDataParallel)
    return {
        "backend": str(dist.get_backend()),
        "cuda_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "current_device": current,
        "is_ddp": is_ddp,
        "module_is_model": getattr(wrapped, "module", None) is model,
        "is_model": wrapped is model,
        "returned": type(wrapped).__name__,
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "device_ids": device_indices(getattr(wrapped, "device_ids", "<missing>")) if is_ddp else None,
    }


def requires_process_group(impl: Implementation) -> str | None:
    """Call the entry point in this process (no process group); return the error type name, or None."""
    config = impl.module("config").DDPConfig()
    module = impl.module("ddp")
    try:
        if impl.resolved_ddp_api() == "DDPManager":
            module.DDPManager(config).parallelize(seeded(_TinyModel, 0))
        else:
            module.parallelize_ddp(seeded(_TinyModel, 0), config)
    except Exception as exc:  # the check asserts on the type
        return type(exc).__name__
    return None


def buffer_sync(impl: Implementation, broadcast_buffers: bool) -> dict[str, list[float]]:
    """Buffers set to the rank number before wrapping: what each rank holds and sees.

    Returns the buffer after construction, the value forward 1 saw, and the
    value forward 2 saw after each rank set its buffer to rank + 10 in between.
    """
    rank = dist.get_rank()
    model = seeded(_Buffered, 1)
    model.offset.fill_(float(rank))
    wrapped = parallelizer(impl, {"broadcast_buffers": broadcast_buffers}).parallelize(model)
    after_init = model.offset.tolist()
    x = torch.ones(2, DIM, dtype=torch.float64, device=device_of(model))
    wrapped(x).sum().backward()
    model.offset.fill_(float(rank + 10))
    wrapped(x).sum().backward()
    return {"after_init": after_init, "forward1": model.seen[0].tolist(), "forward2": model.seen[1].tolist()}


def _recording_hook(record: list[list[int]]) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
        record[-1].append(int(bucket.buffer().numel()))
        return allreduce_hook(state, bucket)

    return hook


def _bucket_sizes(wrapped: DistributedDataParallel, steps: int) -> list[int]:
    record: list[list[int]] = []
    observe_comm(wrapped, _recording_hook(record))
    x = torch.ones(2, 32, dtype=torch.float64, device=device_of(wrapped))
    for _ in range(steps):
        record.append([])
        wrapped(x).square().sum().backward()
        sgd_step(wrapped, 0.0)
    return sorted(record[-1])


def bucket_layouts(impl: Implementation, caps: list[float | None], steps: int) -> dict[str, list[int]] | NotDDP:
    """Bucket sizes (elements, sorted) seen by a comm hook on step ``steps`` for each cap.

    The model has six 1024-element float64 parameters.  Key ``"plain"`` is
    torch's own DDP built with no ``bucket_cap_mb``, for comparison with None,
    on the device the manager put its model on.  When the entry point does not
    return a DDP: :class:`NotDDP`.
    """
    layouts: dict[str, list[int]] = {}
    device = torch.device("cpu")
    for cap in caps:
        wrapped = parallelizer(impl, {"bucket_cap_mb": cap}).parallelize(seeded(bucket_model, 2))
        if not isinstance(wrapped, DistributedDataParallel):
            return NotDDP(type(wrapped).__name__)
        device = device_of(wrapped)
        layouts[repr(cap)] = _bucket_sizes(wrapped, steps)
    plain = DistributedDataParallel(seeded(bucket_model, 2).to(device), device_ids=ddp_device_ids(device))
    layouts["plain"] = _bucket_sizes(plain, steps)
    return layouts


def unused_parameter(impl: Implementation, find_unused_parameters: bool) -> dict[str, Any] | NotDDP:
    """Train two iterations of a model whose forward skips a parameter.

    Returns ``{"error": message or None, "params": parameters after the steps}``;
    the DDP error is caught on the rank so every rank reports it. When the
    entry point does not return a DDP, :class:`NotDDP`.
    """
    model = seeded(_SometimesUnused, 3)
    wrapped = parallelizer(impl, {"find_unused_parameters": find_unused_parameters}).parallelize(model)
    if not isinstance(wrapped, DistributedDataParallel):
        return NotDDP(type(wrapped).__name__)
    global_x = torch.arange(4 * dist.get_world_size() * DIM, dtype=torch.float64).reshape(-1, DIM) / 50
    x = local_rows(global_x, device_of(model))
    try:
        for _ in range(2):
            wrapped(x).square().mean().backward()
            sgd_step(model, 0.1)
    except RuntimeError as error:
        return {"error": str(error), "params": []}
    return {"error": None, "params": params_of(model)}


def grad_bucket_aliasing(impl: Implementation, gradient_as_bucket_view: bool, steps: int) -> list[list[bool]] | NotDDP:
    """Per step, per parameter: does ``param.grad`` lie inside a bucket buffer of that step.

    When the entry point does not return a DDP: :class:`NotDDP`.
    """
    model = seeded(bucket_model, 4)
    config = {"gradient_as_bucket_view": gradient_as_bucket_view, "bucket_cap_mb": 0.01}
    wrapped = parallelizer(impl, config).parallelize(model)
    if not isinstance(wrapped, DistributedDataParallel):
        return NotDDP(type(wrapped).__name__)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ranges: list[tuple[int, int]] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
        buffer = bucket.buffer()
        ranges.append((buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()))
        return allreduce_hook(state, bucket)

    observe_comm(wrapped, hook)
    x = torch.ones(2, 32, dtype=torch.float64, device=device_of(model))
    verdicts: list[list[bool]] = []
    for _ in range(steps):
        ranges.clear()
        wrapped(x).square().sum().backward()
        verdicts.append(
            [p.grad is not None and any(lo <= p.grad.data_ptr() < hi for lo, hi in ranges) for p in model.parameters()]
        )
        sgd_step(model, 0.01)
    return verdicts



def checkpoint_recompute(
    impl: Implementation, mode: bool | str, scopes: list[Any], global_x: torch.Tensor
) -> dict[str, Any]:
    """For each scope: which blocks' attn/mlp ran again in backward, and the gradients.

    Returns ``{"trainable": {block: bool}, "plain_grads": [...], "scopes": {repr(scope):
    {"recomputed": {block: (attn runs in backward, mlp runs in backward)}, "grads": [...]}},
    "dtype": the wrapped model's parameter dtype}``, with ``plain_grads`` from the same
    model wrapped without checkpointing; inputs follow the wrapped model's device and dtype.
    """
    plain = seeded(_MultimodalModel, 6)
    plain_wrapped = parallelizer(impl, {}).parallelize(plain)  # kept alive through backward
    x = local_rows(global_x, device_of(plain)).to(dtype_of(plain))
    square_loss(plain_wrapped(x)).backward()
    result: dict[str, Any] = {"plain_grads": grads_of(plain), "scopes": {}, "dtype": str(dtype_of(plain))}
    for scope in scopes:
        model = seeded(_MultimodalModel, 6)
        blocks = multimodal_blocks(model)
        result["trainable"] = {name: trainable for name, (_, trainable) in blocks.items()}
        config = {"activation_checkpointing": mode, "activation_checkpointing_scope": scope}
        wrapped = parallelizer(impl, config).parallelize(model)
        loss = square_loss(wrapped(x.to(device_of(model), dtype_of(model))))
        before = {name: (b.attn.calls, b.mlp.calls) for name, (b, _) in blocks.items()}
        loss.backward()
        recomputed = {
            name: (b.attn.calls - before[name][0], b.mlp.calls - before[name][1]) for name, (b, _) in blocks.items()
        }
        result["scopes"][repr(scope)] = {"recomputed": recomputed, "grads": grads_of(model)}
    return result


def autocast_output_dtype(impl: Implementation, autocast_dtype: Any) -> str:
    """The dtype (as a string) of a float32 tiny model's output through the wrapper."""
    model = seeded(_TinyModel, 7, torch.float32)
    wrapped = parallelizer(impl, {"autocast_dtype": autocast_dtype}).parallelize(model)
    return str(wrapped(torch.ones(2, DIM, device=device_of(model), dtype=dtype_of(model))).dtype)



def warm_up() -> None:
    """Build tiny DDPs on this rank's device and train each a step: plain, ``static_graph``, checkpointed.

    torch's first DDP in a process imports several hundred modules (about a
    second, far more with a cold bytecode cache on a busy machine), and a
    static graph and activation checkpointing may import more on first use;
    a world started with this as its ``setup`` pays that while it starts, in
    the background when started with ``wait=False``, rather than inside a
    checked step.
    """
    from torch.utils.checkpoint import checkpoint

    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device_ids = [device] if nccl else None
    x = torch.ones(1, 2, device=device)
    plain = DistributedDataParallel(nn.Linear(2, 2).to(device), device_ids=device_ids)
    plain(x).sum().backward()
    static = DistributedDataParallel(nn.Linear(2, 2).to(device), device_ids=device_ids, static_graph=True)
    checkpoint(static, x, use_reentrant=False).sum().backward()
