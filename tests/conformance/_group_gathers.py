"""All-gather callables (``--gather-fn`` targets) right in the whole world and wrong only inside a subgroup.

Each takes ``group=`` and gathers rows that are right without a subgroup, so
the subgroup check's likely cause comes from the rows each member gathered:

- :func:`gather_ignoring_group` gathers over the whole world whatever group it is given;
- :func:`local_slot_at_global_rank` is the torchmetrics-style list gather
  (``tests.forks.gallery_gather_all_tensors``) putting the local tensor back
  at ``dist.get_rank()``, the global rank, instead of the group rank;
- :func:`local_slot_modulo` puts it back at the global rank modulo the
  group's size: wrong rows that follow no rank mix-up the diagnosis knows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.suites.gather.ranks import _WarmUpGather

__all__ = ["gather_ignoring_group", "local_slot_at_global_rank", "local_slot_modulo"]


def gather_ignoring_group(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's ``x`` over the whole world: ``group`` is accepted and ignored."""
    return _WarmUpGather.apply(x)  # a concatenating all-gather over the whole world


def _group_list(x: torch.Tensor, group: Any) -> list[torch.Tensor]:
    """Every member's ``x`` over ``group`` (the world's when None), outside autograd."""
    with torch.no_grad():
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
    return parts


def local_slot_at_global_rank(x: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """The members' tensors, the local one put back at the GLOBAL rank (an IndexError past the group's end)."""
    parts = _group_list(x, group)
    parts[dist.get_rank()] = x
    return parts


def local_slot_modulo(x: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """The members' tensors, the local one put back at the global rank modulo the group's size."""
    parts = _group_list(x, group)
    parts[dist.get_rank() % len(parts)] = x
    return parts
