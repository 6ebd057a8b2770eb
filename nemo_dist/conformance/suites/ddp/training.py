"""Rank-side functions of the DDP training checks: training through the entry point equals the reference.

Every public function here runs on every rank of a world (through
``World.run``), takes an ``Implementation`` and plain data, builds its models
(:mod:`~nemo_dist.conformance.suites.ddp.models`) with ``torch.manual_seed`` so all
ranks start equal, trains them for a few SGD steps through the entry point
(:func:`~nemo_dist.conformance.suites.ddp.entry_point.parallelizer`) and returns the
parameters (and gradients) as CPU tensors, in the dataclasses of
:mod:`~nemo_dist.conformance.suites.ddp.messages`, for the parent to compare:
:func:`train_config` and :func:`contrastive_identity` against a copy trained
in one process on the full batch, :func:`static_graph_training` against the
same model trained without ``static_graph``.

Models are built on CPU and the entry point moves them to the rank's device;
inputs and the single-process copies follow the wrapped model's parameters,
in their dtype, so the same functions run in gloo and NCCL worlds. The other
rank functions of the DDP checks are in :mod:`~nemo_dist.conformance.suites.ddp.ranks`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import (
    NotDDP,
    device_of,
    dtype_of,
    grads_of,
    local_rows,
    parallelizer,
    params_of,
    seeded,
    sgd_step,
    square_loss,
)
from nemo_dist.conformance.suites.ddp.messages import ConfigRun, ContrastiveRun, StaticRun
from nemo_dist.conformance.suites.ddp.models import _SelfCheckpointed, _SometimesUnused, _TinyModel
from nemo_dist.conformance.suites.ddp.wrapped import field_keywords

__all__ = ["contrastive_identity", "static_graph_training", "train_config"]


def _train(wrapped: nn.Module, model: nn.Module, x: torch.Tensor, steps: int, lr: float) -> list[torch.Tensor]:
    """``steps`` SGD steps of ``model`` (wrapped as ``wrapped``) on ``x``; CPU copies of its parameters after."""
    for _ in range(steps):
        square_loss(wrapped(x)).backward()
        sgd_step(model, lr)
    return params_of(model)


def _checkpointed_setting(impl: Implementation) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The checkpointed model of the static-graph check and the fields of its static and dynamic runs."""
    fields = {"activation_checkpointing": True}
    if impl.ddp_wrapper is not None:
        try:
            field_keywords(impl.ddp_wrapper, fields)
        except NotSupported:  # the wrapper cannot checkpoint: the model does it itself
            return _SelfCheckpointed, {}, {}
    return _TinyModel, fields, fields


def static_graph_training(impl: Implementation, global_x: torch.Tensor, steps: int) -> dict[str, StaticRun] | NotDDP:
    """Train with ``static_graph=True`` and without it, in two settings.

    ``checkpointed``: the tiny model with checkpointed blocks (through
    ``activation_checkpointing=True``; a ``--ddp-fn`` wrapper taking no such
    keyword, one that passes ``static_graph`` through ``**kwargs``, say, gets a
    model whose blocks checkpoint themselves); ``unused``: a model with a
    parameter that is never used (the non-static run uses
    ``find_unused_parameters=True``).  Returns each setting's run by its name
    (:class:`~nemo_dist.conformance.suites.ddp.messages.StaticRun`); :class:`NotDDP`
    when the entry point does not return a DDP.
    """
    runs: dict[str, StaticRun] = {}
    settings = {
        "checkpointed": _checkpointed_setting(impl),
        "unused": (_SometimesUnused, {}, {"find_unused_parameters": True}),
    }
    for name, (factory, static_extra, dynamic_extra) in settings.items():
        model = seeded(factory, 5)
        wrapped = parallelizer(impl, {"static_graph": True, **static_extra}).parallelize(model)
        if not isinstance(wrapped, DistributedDataParallel):
            return NotDDP(type(wrapped).__name__)
        x = local_rows(global_x, device_of(model))
        try:
            static_params, error = _train(wrapped, model, x, steps, 0.1), None
        except RuntimeError as raised:  # DDP's own error (an unused parameter without a static graph), on every rank
            static_params, error = [], str(raised)
        other = seeded(factory, 5)
        dynamic = parallelizer(impl, dynamic_extra).parallelize(other)
        dynamic_params = _train(dynamic, other, x, steps, 0.1)
        runs[name] = StaticRun(
            static_graph=getattr(wrapped, "static_graph", None),
            default_static_graph=getattr(dynamic, "static_graph", None),
            static=static_params,
            dynamic=dynamic_params,
            error=error,
        )
    return runs

def _info_nce_terms(anchors: torch.Tensor, candidates: torch.Tensor, first_row: int, tau: float) -> torch.Tensor:
    """Per-row InfoNCE losses of ``anchors`` against all ``candidates``; row i's positive is candidate first_row+i."""
    logits = anchors @ candidates.T / tau
    labels = torch.arange(first_row, first_row + anchors.shape[0], device=anchors.device)
    return nn.functional.cross_entropy(logits, labels, reduction="none")


def contrastive_identity(
    impl: Implementation, global_x: torch.Tensor, global_y: torch.Tensor, steps: int, lr: float, tau: float
) -> ContrastiveRun:
    """Train a linear encoder with a gathered InfoNCE loss, and a full-batch copy beside it.

    Rank r encodes its slice of ``x`` and ``y`` in one DDP forward, gathers the
    ``y`` embeddings with ``all_gather_with_grad``, and takes the mean over its
    rows of the InfoNCE terms against all N candidates.  DDP averages over W
    ranks, so the gradient is (1/W) * sum_r (W/N) * sum_{i in r} grad l_i, which is
    the full-batch gradient of mean_i l_i: the copy computes that in one process.
    The copy runs on the wrapped model's device, in its dtype. Returns the
    gradients of step 1, the parameters after ``steps``, both sides, and the dtype.
    """
    gather = impl.module("gather").all_gather_with_grad
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = global_x.shape[0] // size

    def encoder() -> nn.Module:
        return nn.Linear(global_x.shape[1], 4)

    model = seeded(encoder, 8)
    wrapped = parallelizer(impl, {}).parallelize(model)
    device, dtype = device_of(model), dtype_of(model)
    reference = seeded(encoder, 8).to(device, dtype)
    x, y = local_rows(global_x, device).to(dtype), local_rows(global_y, device).to(dtype)
    global_x, global_y = global_x.to(device, dtype), global_y.to(device, dtype)
    ddp_grads: list[torch.Tensor | None] = []
    reference_grads: list[torch.Tensor | None] = []
    for step in range(steps):
        embedded = wrapped(torch.cat([x, y]))
        candidates = gather(embedded[rows:].contiguous())
        _info_nce_terms(embedded[:rows], candidates, rank * rows, tau).mean().backward()
        full = reference(torch.cat([global_x, global_y]))
        n = global_x.shape[0]
        _info_nce_terms(full[:n], full[n:], 0, tau).mean().backward()
        if step == 0:
            ddp_grads, reference_grads = grads_of(model), grads_of(reference)
        sgd_step(model, lr)
        sgd_step(reference, lr)
    return ContrastiveRun(
        ddp=ddp_grads,
        reference=reference_grads,
        params=params_of(model),
        reference_params=params_of(reference),
        dtype=str(dtype),
    )


def train_config(
    impl: Implementation, config_kwargs: dict[str, Any], global_x: torch.Tensor, steps: int
) -> ConfigRun:
    """Train the tiny model under ``config_kwargs`` and, beside it, in one process on the full batch.

    The model is float64, or float32 when ``autocast_dtype`` is set (autocast
    leaves float64 alone); the full-batch copy runs on the wrapped model's
    device, in its dtype, under the same autocast. Returns both parameter lists
    after ``steps`` SGD steps and the dtype.
    """
    autocast = config_kwargs.get("autocast_dtype")
    dtype = torch.float64 if autocast is None else torch.float32
    model = seeded(_TinyModel, 9, dtype)
    wrapped = parallelizer(impl, config_kwargs).parallelize(model)
    device, dtype = device_of(model), dtype_of(model)  # the entry point may have cast the model
    reference = seeded(_TinyModel, 9, dtype).to(device)
    params = _train(wrapped, model, local_rows(global_x, device).to(dtype), steps, 0.1)
    full = global_x.to(device=device, dtype=dtype)
    for _ in range(steps):
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            out = reference(full)
        square_loss(out).backward()
        sgd_step(reference, 0.1)
    return ConfigRun(params=params, reference=params_of(reference), dtype=str(dtype))
