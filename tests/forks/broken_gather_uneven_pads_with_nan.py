"""Broken gather fork: the no-grad ``uneven=True`` path pads every rank's rows with NaN.

Otherwise the reference. NaN marks the padding for debugging and is cut off
again, so every float gather is right; an integer tensor cannot hold NaN, so
the no-grad gather of integers with rows that differ raises on every rank
(bool holds it as True, cut off too). The float checks of ``uneven=True``
pass it; only an integer no-grad gather with differing rows shows the bug.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.loss.dist_utils import (
    _all_gather_single,
    _AllGatherWithGrad,
    _plan,
    all_gather_with_grad,
)
from nemo_dist.loss.dist_utils import all_gather_no_grad as _reference_no_grad

__all__ = ["_AllGatherWithGrad", "all_gather_no_grad", "all_gather_with_grad"]


def all_gather_no_grad(x: torch.Tensor, *, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference's, padding the uneven rows with NaN."""
    plan = _plan(x, group, uneven, "all_gather_no_grad")
    if plan is None:
        return x.detach()
    _, size, rows = plan
    if rows is None:
        return _reference_no_grad(x, group=group)
    most = max(rows)
    with torch.no_grad():
        padded = torch.full((most, *x.shape[1:]), float("nan"), dtype=x.dtype, device=x.device)  # BUG: ints raise
        padded[: x.shape[0]] = x
        buffer = torch.empty((size * most, *x.shape[1:]), dtype=x.dtype, device=x.device)
        _all_gather_single(buffer, padded, group=group)
        return torch.cat([buffer[r * most : r * most + n] for r, n in enumerate(rows)])
