"""Gallery fork: torchmetrics-style ``gather_all_tensors(result, group=None)`` returning a list.

Pattern: gather every member's tensor over ``group`` (the world's when None)
outside autograd, padding to the largest shape when the shapes differ and
trimming each entry back, then put the local ``result`` into this rank's
slot, ``dist.get_rank(group)``, so the gradient reaches it; a 0-d tensor is
gathered as it is (a list of W 0-d tensors, no error). Bug, under this
contract: the gradient flows only through the local slot, so rank r gets its
own loss's gradient for its own rows, never the other ranks' contributions,
in the whole world and inside a subgroup alike (the group rank is right). It
suits a metric (no gradient crosses ranks), not a loss over the gathered batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["gather_all_tensors"]


def gather_all_tensors(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every member's ``result`` over ``group``, in group rank order; only the local entry carries autograd."""
    group = dist.group.WORLD if group is None else group
    result = result.contiguous()
    size = dist.get_world_size(group)
    with torch.no_grad():
        if result.dim() == 0:
            gathered = [torch.zeros_like(result) for _ in range(size)]
            dist.all_gather(gathered, result, group=group)
        else:
            shape = torch.tensor(result.shape, device=result.device)
            shapes = [torch.zeros_like(shape) for _ in range(size)]
            dist.all_gather(shapes, shape, group=group)
            largest = torch.stack(shapes).max(dim=0).values
            padding: list[int] = []
            for extra in reversed((largest - shape).tolist()):
                padding += [0, int(extra)]
            padded = F.pad(result, padding)
            gathered = [torch.zeros_like(padded) for _ in range(size)]
            dist.all_gather(gathered, padded, group=group)
            gathered = [g[tuple(slice(int(n)) for n in s)] for g, s in zip(gathered, shapes, strict=True)]
    gathered[dist.get_rank(group)] = result  # the local slot alone keeps the autograd graph
    return gathered
