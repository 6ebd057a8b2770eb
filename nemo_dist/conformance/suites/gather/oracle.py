"""What the gather contract expects, computed in the parent from the per-rank data.

Shared by the gather checks and the likely-cause diagnosis: the rows each
rank owns in the gathered output, the upstream gradient each loss hands to
the gather's output, and the gradient rule (on rank r, the sum over ranks s
of rank r's rows of ``g_s``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["expected_grads", "offsets", "upstream_for_loss"]


def offsets(rows: Sequence[int]) -> list[int]:
    """Start row of each rank in the gathered output, then the total: ``[0, n_0, n_0 + n_1, ...]``."""
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    return starts


def expected_grads(upstream: Sequence[torch.Tensor], rows: Sequence[int]) -> list[torch.Tensor]:
    """The gradient rule: on rank r, the sum over ranks s of rank r's rows of ``upstream[s]``.

    Summed in float64 (exact for the small integers the checks draw), cast to the dtype.
    """
    starts = offsets(rows)
    total = torch.stack([g.double() for g in upstream]).sum(0)
    return [total[starts[r] : starts[r + 1]].to(upstream[0].dtype) for r in range(len(rows))]


def upstream_for_loss(
    grads: Sequence[torch.Tensor], loss: str, prefix: int, out_shape: tuple[int, ...], dtype: torch.dtype
) -> list[torch.Tensor]:
    """The gradient of the gathered output on each rank for ``loss`` (see ``_gather_ranks.backward``)."""
    if loss == "sum":
        return [torch.ones(out_shape, dtype=dtype)] * len(grads)
    if loss == "twice":
        return [2 * g for g in grads]
    if loss == "prefix":
        return [torch.cat([g[:prefix], torch.zeros_like(g[prefix:])]) for g in grads]
    return list(grads)
