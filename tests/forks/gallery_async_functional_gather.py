"""Gallery fork: a gather returning torch's ``AsyncCollectiveTensor`` unwaited. Correct.

Pattern (tensor- and sequence-parallel code built on torch's functional
collectives, as torchtitan's and DTensor's helpers are): a thin function that
calls ``torch.distributed._functional_collectives.all_gather_tensor_autograd(x,
gather_dim, group)`` and returns its result as it is. That result is an
``AsyncCollectiveTensor``: the collective may still be in flight, and torch
waits on it only when an operation first reads its values. A caller that reads
its memory without such an operation (pickling it, say) reads the buffer
before the gathered values land.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

__all__ = ["gather_async"]


def gather_async(x: torch.Tensor, gather_dim: int = 0, group: Any = None) -> torch.Tensor:
    """Every rank's ``x`` concatenated on ``gather_dim``, differentiable, as an unwaited AsyncCollectiveTensor."""
    return funcol.all_gather_tensor_autograd(x, gather_dim, dist.group.WORLD if group is None else group)
