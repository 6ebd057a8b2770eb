"""Rank-side functions of the DDP checks but the training ones: what the entry point builds, each field's effect.

Every public function here runs on every rank of a world (through
``World.run``), takes an ``Implementation`` and plain data, builds its models
(:mod:`~nemo_dist.conformance.suites.ddp.models`) with ``torch.manual_seed`` so all
ranks start equal, and returns the dataclasses of
:mod:`~nemo_dist.conformance.suites.ddp.messages` (CPU tensors, ints, bools, strings)
for the parent to assert on: the manager's attributes, where the wrapped
model lives, buffers, bucket layouts, an unused parameter, gradients
aliasing the buckets, and the world setup :func:`warm_up`. The functions that
train through the entry point and compare with a reference run are in
:mod:`~nemo_dist.conformance.suites.ddp.training`; those that watch aten ops
(recompute under checkpointing, dtypes under autocast) in
:mod:`~nemo_dist.conformance.suites.ddp.op_ranks`.

The entry point is the one the implementation pins (``impl.ddp_api``):
``DDPManager(config).parallelize(model)`` or ``parallelize_ddp(model,
config)``; :func:`~nemo_dist.conformance.suites.ddp.entry_point.parallelizer` hides
the difference. Upstream returns the model unwrapped in a world of one rank;
functions that need the DDP object then return
:class:`~nemo_dist.conformance.suites.ddp.entry_point.NotDDP` (or report
``is_ddp``) and leave it to the parent to call that not applicable.

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

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import (
    NotDDP,
    ddp_device_ids,
    device_indices,
    device_of,
    local_rows,
    observe_comm,
    parallelizer,
    params_of,
    resolved_api,
    seeded,
    sgd_step,
)
from nemo_dist.conformance.suites.ddp.messages import (
    BucketLayout,
    BufferSync,
    ManagerAttributes,
    Placement,
    UnusedParameter,
    UnusedRun,
)
from nemo_dist.conformance.suites.ddp.models import (
    BUCKET_WIDTH,
    DIM,
    _Buffered,
    _SometimesUnused,
    _TinyModel,
    bucket_model,
)

__all__ = [
    "CONFIG_FIELDS",
    "bucket_layouts",
    "buffer_sync",
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


def manager_attributes(impl: Implementation, config_kwargs: dict[str, Any]) -> ManagerAttributes:
    """Build a ``DDPManager``; report its rank, world size, device and each config field it mirrors."""
    config = impl.module("config").DDPConfig(**config_kwargs)
    manager, current = _with_other_current_gpu(lambda: impl.module("ddp").DDPManager(config))
    return ManagerAttributes(
        rank=(manager.rank, dist.get_rank()),
        world_size=(manager.world_size, dist.get_world_size()),
        device=str(getattr(manager, "device", "<missing>")),
        current_device=current,
        mirrored={f: (getattr(manager, f, "<missing>"), getattr(config, f)) for f in CONFIG_FIELDS},
    )


def placement(impl: Implementation, config_kwargs: dict[str, Any]) -> Placement:
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
    return Placement(
        backend=str(dist.get_backend()),
        cuda_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        current_device=current,
        is_ddp=is_ddp,
        module_is_model=getattr(wrapped, "module", None) is model,
        is_model=wrapped is model,
        returned=type(wrapped).__name__,
        param_devices=sorted({str(p.device) for p in model.parameters()}),
        param_dtypes=sorted({str(p.dtype) for p in model.parameters()}),
        device_ids=device_indices(getattr(wrapped, "device_ids", "<missing>")) if is_ddp else None,
    )


def requires_process_group(impl: Implementation) -> str | None:
    """Call the entry point in this process (no process group); return the error type name, or None."""
    config = impl.module("config").DDPConfig()
    module = impl.module("ddp")
    try:
        if resolved_api(impl) == "DDPManager":
            module.DDPManager(config).parallelize(seeded(_TinyModel, 0))
        else:
            module.parallelize_ddp(seeded(_TinyModel, 0), config)
    except Exception as exc:  # the check asserts on the type
        return type(exc).__name__
    return None


def buffer_sync(impl: Implementation, broadcast_buffers: bool) -> BufferSync:
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
    return BufferSync(after_init=after_init, forward1=model.seen[0].tolist(), forward2=model.seen[1].tolist())


def _bucket_layout(wrapped: DistributedDataParallel, steps: int) -> list[list[int]]:
    """DDP's buckets after step ``steps``, in bucket order: each the indices of its parameters.

    Read from DDP's reducer, which holds them whatever comm hook the code under
    test registered (torch >= 2.4 has the reader; without it, through a comm
    hook of the check's own, which a DDP with a hook already refuses:
    ``NotApplicable``). The steps run first, so DDP has rebuilt its buckets.
    """
    positions = {p.data_ptr(): index for index, p in enumerate(wrapped.module.parameters())}
    read = getattr(wrapped.reducer, "_get_zeros_like_grad_buckets", None)
    record: list[dict[int, list[int]]] = []
    if read is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
            record[-1][bucket.index()] = [positions.get(p.data_ptr(), -1) for p in bucket.parameters()]
            return allreduce_hook(state, bucket)

        observe_comm(wrapped, hook)
    x = torch.ones(2, BUCKET_WIDTH, dtype=torch.float64, device=device_of(wrapped))
    for _ in range(steps - 1):
        record.append({})
        wrapped(x).square().sum().backward()
        sgd_step(wrapped, 0.0)
    record.append({})
    loss = wrapped(x).square().sum()
    if read is not None:
        # DDP rebuilds its buckets before a step's forward: they are already the ones this step's backward uses.
        return [[positions.get(p.data_ptr(), -1) for p in bucket.parameters()] for bucket in read()]
    loss.backward()
    return [record[-1][index] for index in sorted(record[-1])]


def bucket_layouts(impl: Implementation, caps: list[float | None], steps: int) -> dict[str, BucketLayout] | NotDDP:
    """Per cap: the bucket layout of the entry point's DDP and of torch's own DDP given that cap.

    The model (:func:`~nemo_dist.conformance.suites.ddp.models.bucket_model`) has 24
    float64 parameters of 2 KiB. A layout is what a comm hook sees on step
    ``steps`` (DDP has rebuilt its buckets by then: docs/contract.md, the facts of torch 2.13): the
    buckets in order, each the indices of its parameters in
    ``model.parameters()`` order. Returns ``{repr(cap): BucketLayout}``, the
    layouts beside the DDPs' ``bucket_bytes_cap`` (the cap in bytes tells caps apart where
    the layouts cannot: every cap over about 0.05 MiB gives one bucket on this
    model); torch's DDP is built on the device the entry point
    put its model on, with ``bucket_cap_mb=cap`` (nothing for None) and the
    entry point's DDP's ``find_unused_parameters`` and
    ``gradient_as_bucket_view`` (the first changes when buckets are rebuilt).
    When the entry point does not return a DDP: :class:`NotDDP`.
    """
    layouts: dict[str, BucketLayout] = {}
    for cap in caps:
        wrapped = parallelizer(impl, {"bucket_cap_mb": cap}).parallelize(seeded(bucket_model, 2))
        if not isinstance(wrapped, DistributedDataParallel):
            return NotDDP(type(wrapped).__name__)
        device = device_of(wrapped)
        # The other options that shape buckets as the entry point's DDP has them (docs/contract.md).
        options: dict[str, Any] = {
            name: getattr(wrapped, name) for name in ("find_unused_parameters", "gradient_as_bucket_view")
        }
        if cap is not None:
            options["bucket_cap_mb"] = cap
        plain = DistributedDataParallel(
            seeded(bucket_model, 2).to(device), device_ids=ddp_device_ids(device), **options
        )
        layouts[repr(cap)] = BucketLayout(
            got=_bucket_layout(wrapped, steps),
            torch_ddp=_bucket_layout(plain, steps),
            got_cap_bytes=getattr(wrapped, "bucket_bytes_cap", None),
            torch_cap_bytes=plain.bucket_bytes_cap,
        )
    return layouts


def _train_unused(wrapped: nn.Module, model: nn.Module, x: torch.Tensor) -> UnusedRun:
    """Two SGD steps; DDP's message or None, the parameters after them ([] on error)."""
    try:
        for _ in range(2):
            wrapped(x).square().mean().backward()
            sgd_step(model, 0.1)
    except RuntimeError as error:
        return UnusedRun(error=str(error), params=[])
    return UnusedRun(error=None, params=params_of(model))


def unused_parameter(impl: Implementation, find_unused_parameters: bool) -> UnusedParameter | NotDDP:
    """Train two iterations of a model whose forward skips a parameter, and torch's own DDP beside it.

    Returns the error message or None, the parameters after the steps, and
    the same from a plain ``DistributedDataParallel`` built with this
    ``find_unused_parameters``; the DDP error is caught on the rank so every
    rank reports it. When the entry point does not return a DDP, :class:`NotDDP`.
    """
    model = seeded(_SometimesUnused, 3)
    wrapped = parallelizer(impl, {"find_unused_parameters": find_unused_parameters}).parallelize(model)
    if not isinstance(wrapped, DistributedDataParallel):
        return NotDDP(type(wrapped).__name__)
    device = device_of(model)
    global_x = torch.arange(4 * dist.get_world_size() * DIM, dtype=torch.float64).reshape(-1, DIM) / 50
    x = local_rows(global_x, device)
    got = _train_unused(wrapped, model, x)
    plain = seeded(_SometimesUnused, 3).to(device)
    torch_ddp = DistributedDataParallel(
        plain, device_ids=ddp_device_ids(device), find_unused_parameters=find_unused_parameters
    )
    return UnusedParameter(error=got.error, params=got.params, torch_ddp=_train_unused(torch_ddp, plain, x))


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
    x = torch.ones(2, BUCKET_WIDTH, dtype=torch.float64, device=device_of(model))
    verdicts: list[list[bool]] = []
    for _ in range(steps):
        ranges.clear()
        wrapped(x).square().sum().backward()
        verdicts.append(
            [p.grad is not None and any(lo <= p.grad.data_ptr() < hi for lo, hi in ranges) for p in model.parameters()]
        )
        sgd_step(model, 0.01)
    return verdicts



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
