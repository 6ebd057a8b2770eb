"""Gallery wrapper, broken: FSDP2 that leaves the root's own parameters unsharded, and so never reduced.

Bug, as written to save the all-gathers of small parameters: the blocks are
sharded, but the root's own parameters (an output bias, a final norm) are
kept out of FSDP with ``ignored_params``, as if the root were left
unsharded. They stay plain tensors among the DTensors, and FSDP never
reduces their gradients: each rank keeps its own.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import fully_shard

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard the blocks and the root; BUG: the root's own 1-D parameters are ignored, so never reduced."""
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    own = {p for p in model.parameters(recurse=False) if p.ndim < 2}
    fully_shard(model, mesh=mesh, ignored_params=own or None)
    return model
