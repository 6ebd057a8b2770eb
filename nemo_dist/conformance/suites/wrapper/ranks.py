"""Rank-side functions of the wrapper checks: build, wrap, train through the declared step protocol, report.

Every public function runs on every rank of a world (through ``World.run``),
takes an ``Implementation`` naming a ``--ddp-fn`` wrapper and plain data,
and returns plain data (CPU tensors, strings) for the parent to assert on.
Models are float64 :class:`Linear` layers whose weights come from a seed;
ranks start from different weights where a check says so (rank r from
``seed + r``; from ``seed`` on every rank when the wrapper is declared to
expect an identical start, ``--ddp-start identical``), and the reference
copies start from rank 0's. A sharded wrapper's DTensor parameters and
gradients are compared and copied whole (:mod:`~nemo_dist.conformance.suites.ddp.sharded`). Beside what
the wrapper did, each function computes what the parent needs to name a
likely cause: the rank's own local gradient, the exact full-batch one, and
for ``no_sync`` the gradient of the synced micro-batch alone.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import cpu_copy, dtype_of, params_of
from nemo_dist.conformance.suites.ddp.models import DIM, _Buffered
from nemo_dist.conformance.suites.ddp.sharded import full, is_sharded, sharding
from nemo_dist.conformance.suites.ddp.wrapped import (
    EnvironmentNeeded,
    Wrapped,
    accumulating,
    backward,
    call_refused,
    clear,
    ddp_inside,
    gradient_copies,
    held,
    rank_device,
    sgd,
    wrap,
)
from nemo_dist.conformance.suites.wrapper.messages import (
    AccumulationReport,
    BufferViews,
    FirstCall,
    StartReport,
    TrainReport,
)
from nemo_dist.conformance.suites.wrapper.torch_faults import divide_factor_state

__all__ = [
    "IN_FEATURES",
    "LR",
    "OUT_FEATURES",
    "accumulation",
    "batch",
    "buffer_views",
    "first_call",
    "initial_weights",
    "reductions",
    "start",
    "train",
]

#: The linear model's shape and the SGD rate (a power of two: steps stay exact on small integers).
IN_FEATURES, OUT_FEATURES, LR = 4, 2, 0.125


def initial_weights(seed: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias a seed gives: integers in {-1, 0, 1} (``kind`` "integers") or normal draws."""
    generator = torch.Generator().manual_seed(seed)
    shapes = ((OUT_FEATURES, IN_FEATURES), (OUT_FEATURES,))
    if kind == "integers":
        made = [torch.randint(-1, 2, s, generator=generator).double() for s in shapes]
    else:
        made = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    return made[0], made[1]


def batch(seed: int, kind: str, rows: int) -> torch.Tensor:
    """A global batch of ``rows`` rows: integers in {-1, 0, 1} or normal draws, float64."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    if kind == "integers":
        return torch.randint(-1, 2, (rows, IN_FEATURES), generator=generator).double()
    return torch.randn(rows, IN_FEATURES, generator=generator, dtype=torch.float64)


class Linear(nn.Linear):
    """``nn.Linear(IN_FEATURES, OUT_FEATURES)`` in float64 with the weights of :func:`initial_weights`."""

    def __init__(self, seed: int, kind: str) -> None:
        super().__init__(IN_FEATURES, OUT_FEATURES, dtype=torch.float64)
        weight, bias = initial_weights(seed, kind)
        with torch.no_grad():
            self.weight.copy_(weight)
            self.bias.copy_(bias)


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean() if out.dtype in (torch.bfloat16, torch.float16) else out.square().mean()


def _rows(global_batch: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s share of ``global_batch`` (an equal slice of its rows, in rank order)."""
    share = global_batch.shape[0] // size
    return global_batch[rank * share : (rank + 1) * share]


def _scale(reduction: str, size: int) -> float:
    """The factor of each rank's loss in the full-batch reference: 1/W under a declared mean, 1 under a sum."""
    return 1.0 / size if reduction == "mean" else 1.0


def _own_seed(impl: Implementation, seed: int) -> int:
    """The seed of this rank's initial weights: ``seed + rank``, or ``seed`` under a declared identical start."""
    return seed if _wrapper(impl).identical_start else seed + dist.get_rank()


def _context_name(context: Any) -> str:
    """How reports name an accumulation context of :func:`accumulating` (``no_sync``, else the sync switch)."""
    return getattr(context, "__name__", "set_requires_gradient_sync")


def _wrapper(impl: Implementation) -> Any:
    if impl.ddp_wrapper is None:
        raise RuntimeError("the wrapper checks need a --ddp-fn wrapper")
    return impl.ddp_wrapper


def _plain_grads(model: nn.Module, shares: list[tuple[torch.Tensor, float]]) -> list[torch.Tensor]:
    """Gradients of ``sum(scale * mean(model(x) ** 2))`` over ``shares`` in this process (CPU copies)."""
    model.zero_grad(set_to_none=True)
    for x, scale in shares:
        (scale * _loss(model(x))).backward()
    found = [cpu_copy(p.grad) for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return found


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([cpu_copy(t).reshape(-1).double() for t in tensors])


def _flat_grads(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """:func:`_flat` of gradients, None where a parameter has none."""
    if any(t is None for t in tensors):
        return None
    return _flat([t for t in tensors if t is not None])


def start(impl: Implementation, seed: int) -> StartReport:
    """Wrap a model built from ``seed + rank`` (``seed`` under an identical start); its parameters before and after.

    After: after one forward without grad.

    ``own`` (before) is rounded to the dtype the parameters have after
    wrapping (``dtype``), so that a wrapper changing it compares as it should.
    """
    model = Linear(_own_seed(impl, seed), "normal")
    own = _flat(params_of(model))
    wrapped = wrap(_wrapper(impl), model)
    dtype = dtype_of(model)  # as wrapped: FSDP2 holds the root unsharded, in its compute dtype, after a forward
    x = torch.ones(2, IN_FEATURES, dtype=dtype, device=rank_device())
    with torch.no_grad():
        wrapped.trained(x)
    return StartReport(own=_as(own, dtype), after=_flat(held(wrapped)), dtype=str(dtype))


def _as(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` rounded to ``dtype`` (a wrapper may change the model's), as float64 like every reported tensor."""
    return values.to(dtype).double()


def _copy_of(wrapped: Wrapped, seed: int, kind: str, dtype: torch.dtype) -> nn.Module:
    """A plain :class:`Linear` holding the wrapped model's current parameters (``wrapped.params``), in ``dtype``."""
    copy = Linear(seed, kind).to(rank_device(), dtype)
    with torch.no_grad():
        for mine, theirs in zip(copy.parameters(), wrapped.params, strict=True):
            mine.copy_(full(theirs))
    return copy


def train(impl: Implementation, seed: int, kind: str, global_batch: torch.Tensor, steps: int) -> TrainReport:
    """Train ``steps`` SGD steps through the wrapper, ranks starting from ``seed + rank``; the reference beside.

    Under a declared identical start every rank starts from ``seed``. ``own`` is rounded to the wrapped model's
    dtype; ``output_dtype`` and ``reduced`` are the first step's (a wrapper computing in a lower precision returns
    its output in that).
    """
    wrapper = _wrapper(impl)
    rank, size = dist.get_rank(), dist.get_world_size()
    model = Linear(_own_seed(impl, seed), kind)
    own = _flat(params_of(model))
    wrapped = wrap(wrapper, model)
    dtype, device = dtype_of(model), rank_device()
    data = global_batch.to(device, dtype)
    x = _rows(data, rank, size)
    scale = _scale(wrapper.reduction, size)
    shares = [(_rows(data, r, size), scale) for r in range(size)]
    layout = [(name, p.numel(), is_sharded([p])) for name, p in model.named_parameters()]
    factors = divide_factor_state(wrapped.model)
    first: torch.Tensor | None = None
    output_dtype, reduced = "", []
    params: list[torch.Tensor] = []
    grads: list[torch.Tensor | None] = []
    locals_: list[torch.Tensor] = []
    expected: list[torch.Tensor] = []
    for step in range(steps):
        out = wrapped.trained(x)
        if step == 0:
            first = _flat(held(wrapped))
            output_dtype = str(out.dtype).removeprefix("torch.")
            with reductions() as reduced:
                backward(wrapped, _loss(out))
        else:
            backward(wrapped, _loss(out))
        grads.append(_flat_grads(gradient_copies(wrapped)))
        now = _copy_of(wrapped, seed, kind, dtype)
        locals_.append(_flat(_plain_grads(now, [(x, 1.0)])))
        expected.append(_flat(_plain_grads(now, shares)))
        sgd(wrapped, LR)
        params.append(_flat(held(wrapped)))
    reference = Linear(seed, kind).to(device, dtype)
    references: list[torch.Tensor] = []
    for _ in range(steps):
        step_grads = _plain_grads(reference, shares)
        with torch.no_grad():
            for p, g in zip(reference.parameters(), step_grads, strict=True):
                p.sub_(LR * g.to(device))
        references.append(_flat(params_of(reference)))
    return TrainReport(
        own=_as(own, dtype), start=first, dtype=str(dtype), output_dtype=output_dtype, reduced=reduced,
        divide_factors=factors, params=params, grads=grads, locals=locals_,
        expected=expected, reference=references, layout=layout,
    )


def accumulation(impl: Implementation, seed: int, kind: str, micro: torch.Tensor) -> AccumulationReport:
    """Accumulate micro-batches without syncing, then one synced; the gradient that leaves, and the candidates.

    ``micro`` is ``[M, W * rows, IN_FEATURES]``: micro-batch m of rank r is
    its rows of ``micro[m]``. The first M - 1 backward passes run inside
    ``no_sync()`` (or with ``set_requires_gradient_sync(False)``), the last
    outside it, after one synced step that updates nothing; ``reduced`` and
    ``output_dtype`` are the synced one's. The report's ``offered`` is None when
    the wrapper offers neither. Every rank starts from ``seed``.
    """
    wrapper = _wrapper(impl)
    rank, size = dist.get_rank(), dist.get_world_size()
    wrapped = wrap(wrapper, Linear(seed, kind))
    context = accumulating(wrapped)
    if context is None:
        return AccumulationReport()
    model = wrapped.model
    dtype, device = dtype_of(model), rank_device()
    batches = [micro[m].to(device, dtype) for m in range(micro.shape[0])]
    # One synced step first, with no update, as a trainer's first step: DDP with static_graph=True records its
    # graph on its first iteration and asserts inside torch when that iteration runs under no_sync (torch 2.13).
    backward(wrapped, _loss(wrapped.trained(_rows(batches[0], rank, size))))
    clear(wrapped)
    unsynced: list[tuple[str, str]] = []
    for m, data in enumerate(batches):
        x = _rows(data, rank, size)
        if m < len(batches) - 1:
            with context(), reductions() as ran:
                backward(wrapped, _loss(wrapped.trained(x)), sync=False)
            unsynced += ran
        else:
            out = wrapped.trained(x)
            with reductions() as synced:
                backward(wrapped, _loss(out))
    grad = _flat_grads(gradient_copies(wrapped))
    clear(wrapped)
    reference = Linear(seed, kind).to(device, dtype)
    scale = _scale(wrapper.reduction, size)
    reduced = [(_rows(data, r, size), scale) for data in batches for r in range(size)]
    last = [(_rows(batches[-1], r, size), scale) for r in range(size)]
    own_earlier = [(_rows(data, rank, size), 1.0) for data in batches[:-1]]
    own_last = [(_rows(batches[-1], rank, size), 1.0)]
    return AccumulationReport(
        offered=_context_name(context), dtype=str(dtype), output_dtype=str(out.dtype).removeprefix("torch."),
        reduced=synced, divide_factors=divide_factor_state(model), unsynced_reductions=unsynced, grad=grad,
        expected=_flat(_plain_grads(reference, reduced)), last_only=_flat(_plain_grads(reference, last)),
        unreduced_accumulation=_flat(_plain_grads(reference, own_earlier + last)),
        local_accumulation=_flat(_plain_grads(reference, own_earlier + own_last)),
    )


#: Backend-level collective names (the profiler's ``gloo:`` and ``nccl:`` events, one per collective) that reduce.
_REDUCING = ("reduce",)
#: The profiler's names of tensor dtypes (``c10::BFloat16``), as torch names them.
_PROFILED_DTYPES = {
    "double": "float64", "float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16",
}


@contextlib.contextmanager
def reductions() -> Iterator[list[tuple[str, str]]]:
    """The reducing collectives (all-reduce, reduce-scatter, reduce) the backend runs inside: (event name, dtype).

    Read from torch's profiler, which records each collective the process
    group runs, whether Python or DDP's C++ reducer issued it, with the
    dtype of the tensor it reduced (torch's name, ``"bfloat16"``; the
    profiler's own where torch has none, "" where it recorded none); filled
    when the block exits. Broadcasts and all-gathers (buffers, sharded
    parameters) are not reductions and are left out.
    """
    from torch.autograd.profiler import profile

    found: list[tuple[str, str]] = []
    # The autograd profiler on kineto, as torch.profiler.profile runs it, but without that wrapper's per-cycle
    # warning (torch 2.11 warns even for one cycle; the gate fails on warnings) and without building a
    # FunctionEvent for every operator the block ran: that parse took about 0.25 s of CPU per training block, and
    # only the collectives' names and dtypes are read here.
    with profile(use_kineto=True, record_shapes=True) as profiler:
        yield found
    for name, dtypes in _named_events(profiler):
        if name.startswith(("gloo:", "nccl:")) and any(word in name for word in _REDUCING):
            dtypes = [d for d in dtypes if d]
            found.append((name, _PROFILED_DTYPES.get(dtypes[0], dtypes[0]) if dtypes else ""))


def _named_events(profiler: Any) -> Iterator[tuple[str, list[str]]]:
    """(name, input dtypes) of each event ``profiler`` recorded: from kineto's raw results where this torch keeps
    them (``kineto_results``), else from its parsed events."""
    raw = getattr(profiler, "kineto_results", None)
    if raw is not None and hasattr(raw, "events"):
        for event in raw.events():
            yield event.name(), list(event.dtypes())
        return
    for parsed in profiler.function_events:
        yield parsed.name, list(getattr(parsed, "input_dtypes", None) or [])


def buffer_views(impl: Implementation) -> BufferViews:
    """The buffer each forward saw: set to the rank before wrapping, to rank + 10 before the second step.

    Trains two steps of a float64 linear layer whose ``offset`` buffer its
    forward records; returns the first element each forward saw.
    """
    rank = dist.get_rank()
    model = _Buffered()
    with torch.no_grad():
        model.linear.weight.fill_(0.5)
        model.linear.bias.zero_()
    model.offset.fill_(float(rank))
    wrapped = wrap(_wrapper(impl), model.double())
    x = torch.ones(2, DIM, dtype=dtype_of(model), device=rank_device())
    for value in (None, float(rank + 10)):
        if value is not None:
            model.offset.fill_(value)
        backward(wrapped, _loss(wrapped.trained(x)))
        sgd(wrapped, LR)
    return BufferViews([float(seen.reshape(-1)[0]) for seen in model.seen])


def _raised(exc: BaseException) -> str:
    """``Type: message``; where the message is empty (a bare ``assert``), where it was raised and its line."""
    message = str(exc).strip()
    if message:
        return f"{type(exc).__name__}: {message}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {last.filename}:{last.lineno}: {(last.line or '').strip()}"


def first_call(impl: Implementation) -> FirstCall:
    """One wrap and training step of a small model on this rank: what came back, what it lacks, what failed."""
    try:
        wrapped = wrap(_wrapper(impl), Linear(0, "integers"))
    except EnvironmentNeeded as exc:
        return FirstCall(need=str(exc), error=f"{type(exc.__cause__).__name__}: {exc.__cause__}")
    except Exception as exc:
        return FirstCall(error=_raised(exc), refused=call_refused(exc))
    wrapper = wrapped.wrapper
    missing = [
        (field, name)
        for field, name in (("ddp_after_backward", wrapper.after_backward), ("ddp_zero_grad", wrapper.zero_grad))
        if name is not None and not callable(getattr(wrapped.trained, name, None))
    ]
    context = accumulating(wrapped)
    error = ""
    if not missing:
        try:
            x = torch.ones(2, IN_FEATURES, dtype=dtype_of(wrapped.model), device=rank_device())
            backward(wrapped, _loss(wrapped.trained(x)))
            sgd(wrapped, 0.0)
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).strip()}"
    ddp, at = ddp_inside(wrapped.trained, wrapped.model)  # after a forward: replicate builds its DDP lazily
    shown = ""
    if ddp is not None:
        settings = ("static_graph", "broadcast_buffers", "find_unused_parameters", "gradient_as_bucket_view")
        named = [f"{name}={getattr(ddp, name)!r}" for name in settings if hasattr(ddp, name)]
        cap = getattr(ddp, "bucket_bytes_cap", None)
        named += [] if cap is None else [f"bucket_cap_mb={cap / 2**20:g}"]
        shown = ", ".join(named)
    return FirstCall(
        error=error,
        wrapped=True,
        returned=wrapped.returned,
        ddp_at=at,
        ddp=shown,
        missing=missing,
        dtype=str(dtype_of(wrapped.model)),
        accumulates="" if context is None else _context_name(context),
        sharding=sharding(wrapped.model) if is_sharded(wrapped.model.parameters()) else [],
    )
