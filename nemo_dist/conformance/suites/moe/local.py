"""Rank-local expert parameters: plain tensors of which each rank holds other rows, found by their values, read whole.

An expert-parallel layer may hold its experts as plain parameters, each rank
only its own (Megatron's local experts), where a DTensor's placement would
say which part a rank holds. Such a parameter is found by its shape (its
dim 0 differs from the unsharded layer's parameter, its other dims do not)
and read by its values: at the start every row it holds equals exactly one
row of the unsharded layer's parameter, which says which expert the row is.
With every rank's rows known, the parameter, its gradient or its value after
steps is put back together whole, whatever the placement (blocks,
round-robin). Rows that match no row, or several, or experts held twice or
never, are reported: the layer's weights were not kept.

Every function here is a collective of the world: every rank calls it, in
the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["LABEL", "LocalRows", "find"]

#: How a report's placements name a rank-local parameter (followed by the rows rank 0 holds).
LABEL = "rank-local rows"


@dataclass(frozen=True)
class LocalRows:
    """The rows of the unsharded parameter each rank holds, in its local order (``owners[r][i]``)."""

    owners: tuple[tuple[int, ...], ...]
    full_rows: int

    def whole(self, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor put together from every rank's ``local`` rows (on ``local``'s device)."""
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local.detach().cpu())
        out = parts[0].new_zeros((self.full_rows, *local.shape[1:]))
        for rows, part in zip(self.owners, parts, strict=True):
            out[list(rows)] = part
        return out.to(local.device)

    def label(self) -> str:
        """``rank-local rows 0,1,2`` (the rows rank 0 holds)."""
        return f"{LABEL} {','.join(map(str, self.owners[0]))}"


def _rows_of(local: torch.Tensor, full: torch.Tensor) -> tuple[list[int], list[str]]:
    """The row of ``full`` each row of ``local`` equals (-1: none or several), and what does not match one."""
    flat = full.detach().cpu().reshape(full.shape[0], -1)
    rows, none, several = [], 0, 0
    for row in local.detach().cpu().reshape(local.shape[0], -1):
        matches = torch.nonzero((flat == row).all(dim=1)).reshape(-1).tolist()
        none, several = none + (not matches), several + (len(matches) > 1)
        rows.append(matches[0] if len(matches) == 1 else -1)
    problems = [f"{n} of its {local.shape[0]} rows equal {what} of the unsharded layer's"
                for n, what in ((none, "no row"), (several, "several rows")) if n]
    return rows, problems


def find(
    layer: nn.Module, start: dict[str, torch.Tensor], replicas: int = 1
) -> tuple[dict[str, LocalRows], list[str]]:
    """The rank-local parameters of ``layer`` by name (``start``: the unsharded layer's parameters), and problems.

    Every row must be held by ``replicas`` ranks (1 on the ep mesh; edp where
    ep is borrowed from data parallelism, each expert replicated over it).

    A parameter is rank-local where, on some rank, it is a plain tensor whose
    dim 0 differs from ``start``'s and whose other dims do not. A problem names
    the parameter and what is wrong with its rows on any rank; such a
    parameter is left out of the result.
    """
    mine = [
        name for name, p in layer.named_parameters()
        if not isinstance(p, DTensor) and name in start and p.dim() == start[name].dim() >= 1
        and p.shape[0] != start[name].shape[0] and p.shape[1:] == start[name].shape[1:]
    ]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    names = [n for n, _ in layer.named_parameters() if any(n in found for found in every)]
    params = dict(layer.named_parameters())
    result: dict[str, LocalRows] = {}
    problems: list[str] = []
    for name in names:
        rows, wrong = _rows_of(params[name], start[name])
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (rows, wrong))
        wrong_anywhere = [f"rank {r}: {w}" for r, (_, ws) in enumerate(gathered) for w in ws]
        held = sorted(i for rows_r, _ in gathered for i in rows_r)
        if not wrong_anywhere and held != sorted(list(range(start[name].shape[0])) * replicas):
            times = "once" if replicas == 1 else f"{replicas} times"
            wrong_anywhere.append(f"the ranks hold rows {held}, not each of the {start[name].shape[0]} {times}")
        if wrong_anywhere:
            problems.append(f"{name} ({'; '.join(wrong_anywhere)})")
            continue
        result[name] = LocalRows(tuple(tuple(rows_r) for rows_r, _ in gathered), start[name].shape[0])
    return result, problems
