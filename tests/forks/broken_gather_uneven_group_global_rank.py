"""Broken gather fork: with ``uneven=True`` and ``group=``, the backward keeps the row count of the GLOBAL rank.

Otherwise the reference. The equal-shape path never reads the rank (its
reduce-scatter hands each member its own slice), and without a group the
global rank is the group rank, so only ``uneven=True`` combined with a
subgroup shows the bug: a member whose global rank is not its group rank
keeps another member's row count (a gradient of the wrong shape), or an
IndexError when its global rank is past the group's size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.loss.dist_utils import _AllGatherWithGrad, _GatherRows, _plan, all_gather_no_grad

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference's, passing the global rank where the group rank belongs."""
    plan = _plan(x, group, uneven, "all_gather_with_grad")
    if plan is None:
        return x
    _, size, rows = plan
    return _GatherRows.apply(x, group, dist.get_rank(), size, rows)  # BUG: dist.get_rank(group) belongs here
