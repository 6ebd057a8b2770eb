"""Expert parallelism that runs only the experts present, as Megatron-core's, fairseq's and DeepSpeed's token loops
do: each received row goes through its expert, an expert that received no row is not called, and the output
starts as ``rows * 0`` so that it stays in autograd on a rank that received nothing.

Correct. On a rank whose experts receive no (token, expert) pair their shards get no gradient at all (``.grad``
None), which is legitimate: their gradient is zero. ``--moe-fn tests.forks.gallery_moe_present_experts:apply_ep``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched


def present_only(
    rows: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
    start: Callable[[torch.Tensor], torch.Tensor] = lambda rows: rows * 0,
) -> torch.Tensor:
    """Each row through its local expert; only the experts present are called; the output begins as
    ``start(rows)`` (by default ``rows * 0``, in autograd always)."""
    out = start(rows)
    for e in torch.unique(local).tolist():
        at = torch.nonzero(local == e).reshape(-1)
        out = out.index_copy(0, at, torch.nn.functional.silu(rows[at] @ w1[e]) @ w2[e])
    return out


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard the experts and dispatch tokens to them, computing only the experts present."""
    return dispatched(layer, ep_mesh, compute=present_only)
