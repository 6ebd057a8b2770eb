"""Expert parallelism whose expert step reads the first received row to pick a kernel (a shape probe written for
batches that are never empty): on a rank that receives no (token, expert) pair it raises IndexError while the other
ranks wait in the next all-to-all.

Broken: the checks that run a scenario where a rank receives nothing fail showing that rank's IndexError (not a
HANG). ``--moe-fn tests.forks.gallery_moe_empty_rank_raises:apply_ep``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.forks._experts import dispatched, local_mlp


def probed(rows: torch.Tensor, local: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Each row through its local expert, after probing the first row's width."""
    if rows[0].shape[-1] != w1.shape[1]:
        raise ValueError("rows of the wrong width")
    return local_mlp(rows, local, w1, w2)


def apply_ep(layer: nn.Module, ep_mesh: Any) -> nn.Module:
    """torchtitan's dispatch, the expert step probing its first row."""
    return dispatched(layer, ep_mesh, compute=probed)
