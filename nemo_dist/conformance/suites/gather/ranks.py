"""Rank side of the gather checks: module-level functions a world runs on every rank.

Each function takes an :class:`Implementation` and plain per-rank data (lists of
CPU tensors indexed by rank, layout names, loss names), calls the gather under
test through its :class:`~nemo_dist.conformance.suites.gather.target.GatherTarget`
(a dist_utils module or one callable, its output turned into the
concatenation), works on the rank's device (the current CUDA device under
NCCL, else CPU) and returns CPU tensors or the dataclasses of
:mod:`~nemo_dist.conformance.suites.gather.messages`, so the parent asserts and
hypothesis shrinks there. Functions that expect an error catch it and
return ``(type name, message)`` so that the world stays healthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.adapters import signature
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.needs_gpu import gpu_need
from nemo_dist.conformance.suites.gather.messages import (
    Alone,
    AutogradParts,
    BackwardRun,
    BothGathers,
    FirstCall,
    Gathered,
    GroupGathered,
    PrecisionRun,
)
from nemo_dist.conformance.suites.gather.target import describe, target
from nemo_dist.testing.strategies import apply_layout

__all__ = [
    "LOSSES",
    "alone",
    "autograd_function",
    "backward",
    "first_call",
    "forward",
    "grouped",
    "grouped_forward",
    "precision",
    "raises",
    "same_bits",
    "uneven",
    "warm_up",
]

#: Losses of :func:`backward`: how the gathered output ``out`` feeds the backward pass.
LOSSES = ("direct", "weighted", "sum", "twice", "prefix")

_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}

# Process groups by member ranks. new_group is a collective of the whole world:
# every rank creates the same groups in the same order (the parent sends every
# rank the same partitions), so the caches stay in step.
_GROUPS: dict[tuple[int, ...], Any] = {}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have the same dtype, shape and bit pattern (NaN equals NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype == torch.bool:
        a, b = a.view(_BITS[a.element_size()]), b.view(_BITS[b.element_size()])
    return bool(torch.equal(a, b))


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _device() -> torch.device:
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _input(tensor: torch.Tensor, layout: str, requires_grad: bool) -> torch.Tensor:
    """The rank's input: on the rank's device, in ``layout``, a leaf."""
    x = apply_layout(tensor.to(_device()), layout)
    return x.requires_grad_() if requires_grad else x


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().cpu()


def _group(partition: Sequence[Sequence[int]]) -> Any:
    """This rank's group among ``partition`` (creating every group once, in order)."""
    mine = None
    for members in partition:
        key = tuple(members)
        if key not in _GROUPS:
            _GROUPS[key] = dist.new_group(list(key))
        if _rank() in key:
            mine = _GROUPS[key]
    return mine


def first_call(impl: Implementation) -> FirstCall:
    """What a first call of ``impl``'s gather callable on this rank gave, as text (:class:`FirstCall`).

    The call gathers a small (2, 3) float tensor. Keys: ``form`` (the form
    of its gathered value: "cat", "tuple" or "stacked"), ``missing`` (the
    parameters a "missing required argument" ``TypeError`` named, joined by
    commas), ``error`` (any other exception, or a value that is no
    gathered form, as ``Type: message``) and ``cuda`` (for a call on a CPU
    tensor whose failure says it needs a GPU: the evidence
    :func:`~nemo_dist.conformance.engine.needs_gpu.gpu_need` found, such as the
    raising line ``assert x.is_cuda``); each empty when it does not apply,
    all empty when no callable is checked.
    """
    if impl.gather_fn is None:
        return FirstCall()
    x = torch.arange(6, dtype=torch.float32, device=_device()).reshape(2, 3) + 10 * _rank()
    try:
        return FirstCall(form=target(impl).first_call(x))
    except Exception as exc:
        return FirstCall(
            missing=",".join(signature.missing_in(exc)),
            error=f"{type(exc).__name__}: {str(exc).strip()}",
            cuda=gpu_need(exc) if x.device.type != "cuda" else "",
        )


def forward(
    impl: Implementation,
    inputs: Sequence[torch.Tensor],
    layout: str,
    *,
    no_grad: bool,
    requires_grad: bool,
    uneven: bool = False,
) -> Gathered:
    """Gather this rank's input (in ``layout``) with the target, with or without grad (and ``uneven=True``).

    Returns the output (as the concatenation), its ``requires_grad`` and
    whether the input kept its bits.
    """
    x = _input(inputs[_rank()], layout, requires_grad)
    before = x.detach().clone()
    out = target(impl).gather(x, no_grad=no_grad, uneven=uneven)
    return Gathered(out=_cpu(out), requires_grad=out.requires_grad, input_intact=same_bits(x.detach(), before))


def backward(
    impl: Implementation,
    inputs: Sequence[torch.Tensor],
    layout: str,
    grads: Sequence[torch.Tensor],
    grad_layout: str,
    loss: str,
    prefix: int = 0,
) -> BackwardRun:
    """Gather with grad, run ``loss`` (one of :data:`LOSSES`) backward; return ``x.grad``.

    ``g`` is this rank's upstream gradient in ``grad_layout``. Losses: "direct"
    ``out.backward(g)``; "weighted" ``(out * g).sum()``; "sum" ``out.sum()``;
    "twice" ``(out * g).sum() + (out * g).sum()``; "prefix" ``(out[:prefix] *
    g[:prefix]).sum()``. Also reports whether the input and ``g`` kept their bits,
    and the gradient retained on the gathered output (``out.retain_grad()``), or
    None when the output is a leaf (the identity of a world of one).
    """
    x = _input(inputs[_rank()], layout, True)
    g = apply_layout(grads[_rank()].to(_device()), grad_layout)
    x_before, g_before = x.detach().clone(), g.clone()
    out = target(impl).gather(x)
    if not out.is_leaf:
        out.retain_grad()
    if loss == "direct":
        out.backward(g)
    elif loss == "weighted":
        (out * g).sum().backward()
    elif loss == "sum":
        out.sum().backward()
    elif loss == "twice":
        ((out * g).sum() + (out * g).sum()).backward()
    elif loss == "prefix":
        (out[:prefix] * g[:prefix]).sum().backward()
    else:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    return BackwardRun(
        grad=_cpu(x.grad),
        input_intact=same_bits(x.detach(), x_before),
        grad_intact=same_bits(g, g_before),
        out_grad=None if out.is_leaf else _cpu(out.grad),
    )


def precision(
    impl: Implementation, examples: Sequence[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]]
) -> list[PrecisionRun]:
    """For each ``(inputs, grads)`` of ``examples`` (one per dtype): gather with grad, run ``out.backward(g)``.

    Returns, per example, the output (as the concatenation) and ``x.grad``:
    several dtypes in one step, so the precision check costs one step an example.
    """
    results = []
    for inputs, grads in examples:
        x = _input(inputs[_rank()], "contiguous", True)
        out = target(impl).gather(x)
        out.backward(grads[_rank()].to(_device()))
        results.append(PrecisionRun(out=_cpu(out), grad=_cpu(x.grad)))
    return results


def autograd_function(
    impl: Implementation, inputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]
) -> AutogradParts:
    """Apply the module's ``_AllGatherWithGrad``; backward of ``sum_i (parts[i] * g_i).sum()``.

    ``g_i`` are the rows of this rank's upstream gradient for slice i. Returns
    the parts and ``x.grad``.
    """
    function = impl.module("gather")._AllGatherWithGrad
    x = _input(inputs[_rank()], "contiguous", True)
    g = grads[_rank()].to(_device())
    parts = function.apply(x)
    n = x.shape[0]
    loss = sum(((part * g[i * n : (i + 1) * n]).sum() for i, part in enumerate(parts)), x.new_zeros(()))
    loss.backward()
    return AutogradParts(parts=[_cpu(part) for part in parts], grad=_cpu(x.grad))


def _with_and_without_grad(x: torch.Tensor, g: torch.Tensor, gather: Any, **kwargs: Any) -> BothGathers:
    """Gather with grad and run ``out.backward(g)``, then gather without grad; return both.

    The no-grad gather runs even when the first part raised, and the error is
    raised only after it: a rank that fails after its collectives (an
    IndexError in backward, say) still joins the next one, so the other ranks
    do not wait for it and the group stays in step for the next call.
    """
    error: Exception | None = None
    out = None
    try:
        out = gather.gather(x, **kwargs)
        out.backward(g)
    except Exception as exc:  # raised after the no-grad collective below
        error = exc
    plain = gather.gather(x, no_grad=True, **kwargs)
    if error is not None:
        raise error
    assert out is not None
    return BothGathers(
        out=_cpu(out), grad=_cpu(x.grad), no_grad_out=_cpu(plain), no_grad_requires_grad=plain.requires_grad
    )


def uneven(
    impl: Implementation, inputs: Sequence[torch.Tensor], layout: str, grads: Sequence[torch.Tensor]
) -> BothGathers:
    """Gather with ``uneven=True`` (with and without grad) and run ``out.backward(g)``."""
    x = _input(inputs[_rank()], layout, True)
    return _with_and_without_grad(x, grads[_rank()].to(_device()), target(impl), uneven=True)


def grouped(
    impl: Implementation,
    inputs: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    partition: Sequence[Sequence[int]],
    *,
    uneven: bool = False,
) -> BothGathers:
    """Gather over this rank's group of ``partition`` (``group=``; ``uneven=True`` too), then ``out.backward(g)``."""
    group = _group(partition)
    x = _input(inputs[_rank()], "contiguous", True)
    extra = {"uneven": True} if uneven else {}
    return _with_and_without_grad(x, grads[_rank()].to(_device()), target(impl), group=group, **extra)


def grouped_forward(
    impl: Implementation, inputs: Sequence[torch.Tensor], partition: Sequence[Sequence[int]]
) -> GroupGathered:
    """Gather (with grad, of an ``x`` that requires grad) over this rank's group of ``partition``; no backward.

    Returns the output (as the concatenation): the rows each member gathered,
    even where a backward would fail on the output's shape.
    """
    group = _group(partition)
    x = _input(inputs[_rank()], "contiguous", True)
    return GroupGathered(out=_cpu(target(impl).gather(x, group=group)))


def alone(impl: Implementation, inputs: Sequence[torch.Tensor], layout: str) -> Alone:
    """Gather in a world of one rank or with no process group: is the output ``x`` itself?

    Runs on a rank or directly in a process without a process group.
    """
    gather = impl.module("gather")
    x = _input(inputs[_rank()], layout, inputs[_rank()].dtype.is_floating_point)
    out = gather.all_gather_with_grad(x)
    plain = gather.all_gather_no_grad(x)
    return Alone(is_x=out is x, no_grad_out=_cpu(plain), no_grad_requires_grad=plain.requires_grad)


def raises(
    impl: Implementation,
    inputs: Sequence[Any],
    function: str,
    *,
    uneven: bool = False,
    group_partition: Sequence[Sequence[int]] | None = None,
    group_of: int | None = None,
) -> tuple[str, str]:
    """Call ``all_gather_<function>`` on this rank's input; return ``(exception type, message)``.

    The error is the call's own, never one of combining what it returned:
    ``("no error", "returned " + what it returned)`` when nothing was raised
    (:func:`~nemo_dist.conformance.suites.gather.target.describe`: "returned shape
    (2,)", "returned a tuple of 2 tensors of shape ()").
    ``group_partition`` makes groups; ``group_of`` picks the group of that rank
    (so other ranks call as non-members), else this rank's own group.
    """
    group = None
    if group_partition is not None:
        group = _group(group_partition)
        if group_of is not None:
            group = next(_GROUPS[tuple(m)] for m in group_partition if group_of in m)
    x = inputs[_rank()]
    if isinstance(x, torch.Tensor):
        x = x.to(_device())
    try:
        out = target(impl).returned(x, no_grad=function == "no_grad", group=group, uneven=uneven)
    except Exception as exc:  # any error of the call: the check asserts on its type and message
        return type(exc).__name__, str(exc)
    return "no error", f"returned {describe(out)}"


class _WarmUpGather(torch.autograd.Function):
    """A minimal all-gather with autograd: its first backward pays the engine's lazy imports."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


def warm_up() -> None:
    """Run one gather with autograd, forward and backward, through a custom autograd Function.

    A world's setup: the first backward through any custom Function (and the
    first collectives of each kind) may import modules lazily, seconds with a
    cold bytecode cache on a busy machine; paid here, while the world starts,
    not inside the first checked step.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    x = torch.ones(2, 3, device=device, requires_grad=True)
    _WarmUpGather.apply(x).sum().backward()
