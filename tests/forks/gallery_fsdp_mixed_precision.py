"""Gallery wrapper, correct: FSDP2 with the usual mixed precision, compute in bfloat16 and gradients reduced in float32.

Pattern (the mixed-precision recipe of torchtitan and torchtune,
re-expressed): ``fully_shard`` each block then the root with
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``.
The sharded parameters keep the model's dtype (float64 here) and the
optimizer updates them there; each forward all-gathers them cast to
bfloat16, so forward and backward compute in bfloat16; the gradients are
reduce-scattered in float32 and stored in the parameters' dtype. Gradients
averaged (FSDP's default divide factor); nothing broadcast
(``--ddp-start identical``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, computing in bfloat16, gradients averaged in float32."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard_blocks_then_root(model, mesh, mp_policy=policy)
    return model
