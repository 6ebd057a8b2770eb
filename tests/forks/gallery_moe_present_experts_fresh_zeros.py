"""Expert parallelism that runs only the experts present and starts their output as a fresh zeros tensor
(``rows.new_zeros(...)``), as six public layers written in this common style do.

Broken: on a rank that receives no (token, expert) pair nothing in autograd connects the experts' output to the
tokens it received, so that rank skips the backward all-to-alls while the other ranks wait in them: a hang (on
NCCL; gloo may abort). Seen only where a rank receives nothing, which the moe suite steers the router to make.
``--moe-fn tests.forks.gallery_moe_present_experts_fresh_zeros:apply_ep``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched
from tests.forks.gallery_moe_present_experts import present_only


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """Shard the experts and dispatch tokens to them, computing only the experts present from a fresh zeros output."""
    return dispatched(layer, ep_mesh, compute=functools.partial(present_only, start=_fresh_zeros))


def _fresh_zeros(rows: torch.Tensor) -> torch.Tensor:
    return rows.new_zeros(rows.shape)
