"""Broken gather fork: inside a group, the group rank is taken as the global rank minus the group's first member.

Otherwise ``independent_gather`` (list all-gather forward; backward sums the
stacked gradient over the group and keeps the slot at this rank's group
rank). That offset is the group rank for a group of contiguous ranks
({1, 2} of 3), so checks that split the world into contiguous ranges pass
it; in a group of interleaved ranks ({0, 2} of 3, {1, 3} of 4) rank 2 or 3
reads slot 2 of a group of two: an IndexError, or another member's rows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks.independent_gather import (
    _AllGatherWithGrad,
    _Gather,
    _rank_and_size,
    _rows_of_every_rank,
    _validate,
    all_gather_no_grad,
)

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


def all_gather_with_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """``independent_gather``'s, with the group rank computed from the first member."""
    _validate(x)
    where = _rank_and_size(group)
    if where is None:
        return x
    _, size = where
    first = dist.get_process_group_ranks(group)[0] if group is not None else 0
    rank = dist.get_rank() - first  # BUG: the group rank only when the group's ranks are contiguous
    rows = _rows_of_every_rank(x, group, size) if uneven else [x.shape[0]] * size
    return _Gather.apply(x, group, rank, rows)
