"""Gallery fork: ``gather_reversed`` returns the ranks in reverse order.

Pattern: a hand-rolled gather (an off-by-one in a ring, say) that lays the
ranks out last to first. The autograd path is consistent with that layout:
the gallery's summed ``GatherLayer`` (a correct tuple gather), then the parts
concatenated in reverse, so the gradient of x on rank r is the sum over s of
g_s's rows at position W-1-r. Bug: rank order reversed, in forward
and backward alike.
"""

from __future__ import annotations

import torch

from tests.forks.gallery_gather_layer_summed import GatherLayer as _GatherParts

__all__ = ["gather_reversed"]


def gather_reversed(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated on dim 0, last rank first."""
    parts = _GatherParts.apply(x)
    return torch.cat(parts[::-1], dim=0)  # BUG: ranks in reverse order
