"""Gallery wrapper, broken: FSDP2 whose gradients are reduced in bfloat16 (a mixed-precision recipe's reduce_dtype).

Bug, the class of a recipe leaving ``reduce_dtype`` at bfloat16: the policy
is ``MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.bfloat16)``.
``param_dtype=None`` keeps the compute in the parameters' dtype (float64
here), so the reduction alone is lowered: FSDP casts each gradient to
bfloat16, divides and reduces it there, and casts the result back to the
parameters' dtype, so the reduced gradients carry bfloat16's 8-bit
mantissa. (With ``param_dtype=torch.bfloat16`` as well, FSDP drops a
``reduce_dtype`` equal to it and reduces in the bfloat16 the gradients were
computed in: the same bug, hidden behind the lower compute.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, computing in its dtype; BUG: gradients reduced in bfloat16."""
    policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.bfloat16)  # BUG: reduce_dtype bfloat16
    shard_blocks_then_root(model, mesh, mp_policy=policy)
    return model
