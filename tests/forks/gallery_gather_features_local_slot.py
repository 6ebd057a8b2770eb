"""Gallery fork: open_clip-style ``gather_features`` with the local tensor put back in its slot.

Pattern: gather every rank's features outside autograd, then replace this
rank's entry of the list with the local ``x`` so that the gradient can reach
it, and concatenate. Bug: the gradient flows only through the local slot, so
rank r gets g_r's rows for r alone (its own loss's gradient), never the other
ranks' contributions. Right only when each rank's loss is scaled and the
gradients are summed elsewhere (e.g. by DDP) -- not under this contract.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["gather_features"]


def gather_features(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` on dim 0; only the local slot carries autograd."""
    with torch.no_grad():
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
    parts[dist.get_rank()] = x  # BUG: the other slots are detached
    return torch.cat(parts, dim=0)
