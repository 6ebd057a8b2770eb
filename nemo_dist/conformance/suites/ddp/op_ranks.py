"""Rank-side functions of the checks that watch aten ops: recompute under checkpointing, dtypes under autocast.

Every public function here runs on every rank of a world (through
``World.run``), wraps seeded models through the implementation's entry point
(:func:`~nemo_dist.conformance.suites.ddp.entry_point.parallelizer`) and observes the
ops they execute with the dispatch modes of :mod:`~nemo_dist.conformance.suites.ddp.ops`:

- :func:`checkpoint_recompute`: per block, how often its attention and MLP ran
  forward, and again during backward, and how many of its matmuls and of its
  other ops ran in each (:func:`observe_blocks`); the gradients beside those of
  an uncheckpointed copy.
- :func:`autocast_ops`: under ``autocast_dtype``, the dtypes of the parameters,
  of every matmul and every floating-point op of the forward and of the
  gradients, and the gradients beside those of an explicit ``torch.autocast``
  reference in one process on the full batch.

Models are built on CPU; inputs and reference copies follow the wrapped
model's device and dtype, and tensors go back as CPU copies, so the same
functions run in gloo and NCCL worlds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import (
    device_of,
    dtype_of,
    grads_of,
    local_rows,
    parallelizer,
    seeded,
    square_loss,
)
from nemo_dist.conformance.suites.ddp.messages import AutocastOps, BlockRun, OpCounts, Recompute, ScopeRun
from nemo_dist.conformance.suites.ddp.models import _Block, _Counted, _MultimodalModel, _TinyModel, multimodal_blocks
from nemo_dist.conformance.suites.ddp.ops import MatmulCounter, OpDtypes

__all__ = ["autocast_ops", "checkpoint_recompute", "counted_parts", "observe_blocks"]


#: The gradients without checkpointing by (implementation, batch), kept per rank: the same for every mode and scope.
_PLAIN_RUNS: dict[tuple[Implementation, bytes], tuple[list[Any], torch.Tensor, str]] = {}


def _plain_run(impl: Implementation, global_x: torch.Tensor) -> tuple[list[Any], torch.Tensor, str]:
    """The hand-made model wrapped without checkpointing, trained one step on this rank's rows of ``global_x``.

    Returns its gradients, the rows as the wrapped model took them (its device and dtype) and its parameter
    dtype; computed once per rank, implementation and batch.
    """
    key = (impl, global_x.numpy().tobytes())
    if key not in _PLAIN_RUNS:
        plain = seeded(_MultimodalModel, 6)
        plain_wrapped = parallelizer(impl, {}).parallelize(plain)  # kept alive through backward
        x = local_rows(global_x, device_of(plain)).to(dtype_of(plain))
        square_loss(plain_wrapped(x)).backward()
        _PLAIN_RUNS[key] = (grads_of(plain), x, str(dtype_of(plain)))
    return _PLAIN_RUNS[key]


def counted_parts(blocks: dict[str, _Block]) -> dict[str, dict[str, _Counted]]:
    """Block name -> its counted sub-modules by name (``attn``, ``mlp``), taken before the model is wrapped.

    An implementation may replace a block's children by checkpoint wrappers;
    what runs inside them, and what the counters name, are these modules.
    """
    return {name: {"attn": block.attn, "mlp": block.mlp} for name, block in blocks.items()}


def observe_blocks(
    parts: dict[str, dict[str, _Counted]], loss_of: Callable[[], torch.Tensor]
) -> dict[str, BlockRun]:
    """Run ``loss_of()`` and its backward under op counters; per block, its *block run*.

    A block run (:mod:`~nemo_dist.conformance.suites.ddp.checkpoint_rules`) holds each
    counted sub-module's ``forward`` runs in forward and again in backward,
    and the matmuls and other ops they executed in each. The forward runs
    with torch's checkpoint early stop off, so a checkpointed region
    recomputes to its end: full checkpointing runs every op of a selected
    block again, a selective policy fewer (those whose outputs it saved are
    answered from its cache).
    """
    start = {name: {k: m.calls for k, m in subs.items()} for name, subs in parts.items()}
    forward, backward = MatmulCounter(), MatmulCounter()
    with forward, set_checkpoint_early_stop(False):
        loss = loss_of()
    between = {name: {k: m.calls for k, m in subs.items()} for name, subs in parts.items()}
    with backward:
        loss.backward()

    def ops(counter: MatmulCounter, kind: str, subs: dict[str, _Counted]) -> int:
        return sum(getattr(counter, kind)[m] for m in subs.values())

    return {
        name: BlockRun(
            calls={k: (between[name][k] - start[name][k], m.calls - between[name][k]) for k, m in subs.items()},
            ops=OpCounts(
                matmuls=(ops(forward, "matmuls", subs), ops(backward, "matmuls", subs)),
                others=(ops(forward, "others", subs), ops(backward, "others", subs)),
            ),
        )
        for name, subs in parts.items()
    }


def _wrapped_loss(wrapped: Any, rows: torch.Tensor) -> torch.Tensor:
    return square_loss(wrapped(rows))


#: Results of :func:`checkpoint_recompute` by its arguments, kept per rank: the core and extended checks read one run.
_RECOMPUTES: dict[tuple[Implementation, str, str, bytes], Recompute] = {}


def checkpoint_recompute(
    impl: Implementation, mode: bool | str, scopes: list[Any], global_x: torch.Tensor
) -> Recompute:
    """For each scope: per block, its block run (:func:`observe_blocks`); the gradients.

    Beside them the gradients of the same model wrapped without checkpointing
    (:class:`~nemo_dist.conformance.suites.ddp.messages.Recompute`). Computed once
    per rank for the same arguments.
    """
    key = (impl, repr(mode), repr(scopes), global_x.numpy().tobytes())
    if key in _RECOMPUTES:
        return _RECOMPUTES[key]
    plain_grads, x, dtype = _plain_run(impl, global_x)
    trainable: dict[str, bool] = {}
    runs_by_scope: dict[str, ScopeRun] = {}
    for scope in scopes:
        model = seeded(_MultimodalModel, 6)
        blocks = multimodal_blocks(model)
        trainable = {name: selected for name, (_, selected) in blocks.items()}
        parts = counted_parts({name: block for name, (block, _) in blocks.items()})
        config = {"activation_checkpointing": mode, "activation_checkpointing_scope": scope}
        wrapped = parallelizer(impl, config).parallelize(model)
        rows = x.to(device_of(model), dtype_of(model))
        runs = observe_blocks(parts, functools.partial(_wrapped_loss, wrapped, rows))
        runs_by_scope[repr(scope)] = ScopeRun(runs=runs, grads=grads_of(model))
    result = Recompute(trainable=trainable, plain_grads=plain_grads, dtype=dtype, scopes=runs_by_scope)
    _RECOMPUTES[key] = result
    return result


def autocast_ops(
    impl: Implementation, autocast_dtype: Any, global_x: torch.Tensor, checkpointing: bool | str = False
) -> AutocastOps:
    """Train step of a float32 tiny model with ``autocast_dtype``: what ran in which dtype, and the gradients.

    Returns :class:`~nemo_dist.conformance.suites.ddp.messages.AutocastOps`; its
    backward matmuls include a checkpointed block's recompute, with
    ``checkpointing`` (the ``activation_checkpointing`` the model is wrapped
    with). ``reference`` holds the gradients of the same model in
    one process on the full batch, its forward under an explicit
    ``torch.autocast(device type, autocast_dtype)`` (disabled for None), the
    loss in float32 outside it, as the wrapped run computes it.
    """
    model = seeded(_TinyModel, 7, torch.float32)
    config: dict[str, Any] = {"autocast_dtype": autocast_dtype}
    if checkpointing:
        config["activation_checkpointing"] = checkpointing
    wrapped = parallelizer(impl, config).parallelize(model)
    device, dtype = device_of(model), dtype_of(model)
    params = sorted({str(p.dtype) for p in model.parameters()})
    recorder = OpDtypes()
    with recorder:
        out = wrapped(local_rows(global_x, device).to(dtype))
    backward = OpDtypes()
    with backward:
        square_loss(out).backward()
    reference = seeded(_TinyModel, 7, torch.float32).to(device)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        full = reference(global_x.to(device, torch.float32))
    square_loss(full).backward()
    return AutocastOps(
        params=params,
        output=str(out.dtype),
        reference_output=str(full.dtype),
        matmuls=recorder.matmuls,
        backward_matmuls=backward.matmuls,
        floating=sorted(recorder.floating),
        grad_dtypes=sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None}),
        grads=grads_of(model),
        reference=grads_of(reference),
    )
