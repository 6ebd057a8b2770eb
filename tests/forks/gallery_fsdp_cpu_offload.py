"""Gallery wrapper, correct: FSDP2 with the sharded parameters, gradients and optimizer step offloaded to the CPU.

Pattern (the ``offload_policy`` option of torchtitan's and torchtune's
``fully_shard`` calls, re-expressed): each block then the root sharded with
``CPUOffloadPolicy(pin_memory=False)``. The sharded parameters and their
gradients live on the CPU and the optimizer steps there; each forward and
backward copies them to the compute device (the CPU itself under gloo).
Gradients averaged (FSDP's default); nothing broadcast
(``--ddp-start identical``).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, parameters and gradients offloaded to the CPU, averaged."""
    shard_blocks_then_root(model, mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
    return model
