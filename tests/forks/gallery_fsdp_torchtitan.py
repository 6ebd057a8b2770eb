"""Gallery wrapper, correct: torchtitan-style FSDP2, each block sharded, then the root; gradients summed.

Pattern (torchtitan's ``apply_fsdp``, re-expressed): ``fully_shard`` on
each transformer block (here: each child module that holds parameters),
then on the root, over the data-parallel mesh. Its trainer normalises the
loss by the global token count itself, so the gradient divide factor is set
to 1: FSDP sums the ranks' gradients (``--ddp-reduction sum``). It
broadcasts nothing: every rank builds the model from one seed
(``--ddp-start identical``).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

__all__ = ["apply_fsdp", "shard_blocks_then_root"]


def shard_blocks_then_root(model: nn.Module, mesh: Any, **kwargs: Any) -> FSDPModule:
    """``fully_shard`` each child holding parameters, then the root (which keeps its own parameters)."""
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh, **kwargs)
    sharded = fully_shard(model, mesh=mesh, **kwargs)
    assert isinstance(sharded, FSDPModule)
    return sharded


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, gradients summed over the ranks (divide factor 1)."""
    shard_blocks_then_root(model, mesh)
    # The factor is a setting of each FSDP module's own parameters: set on every one, not the root alone.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
    return model
