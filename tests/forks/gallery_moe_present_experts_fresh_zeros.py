"""Expert parallelism that runs only the experts present and starts their output as a fresh zeros tensor
(``rows.new_zeros(...)``), as six public layers written in this common style do.

Broken: on a rank that receives no (token, expert) pair nothing in autograd connects the experts' output to the
tokens it received, so that rank skips the backward all-to-alls while the other ranks wait in them: a hang (on
NCCL; gloo may abort). Seen only where a rank receives nothing, which the moe suite steers the router to make.
``--moe-fn tests.forks.gallery_moe_present_experts_fresh_zeros:apply_ep``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched


def present_only(rows: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Each row through its local expert; only the experts present are called; the output starts outside autograd."""
    out = rows.new_zeros(rows.shape)
    for e in torch.unique(local).tolist():
        at = torch.nonzero(local == e).reshape(-1)
        out = out.index_copy(0, at, torch.nn.functional.silu(rows[at] @ w1[e]) @ w2[e])
    return out


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard the experts and dispatch tokens to them, computing only the experts present."""
    return dispatched(layer, ep_mesh, compute=present_only)
