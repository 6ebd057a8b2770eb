"""Gallery wrapper: accelerate's ``comm_hook`` option, a DDP whose comm hook compresses to bfloat16 or float16.

Pattern (accelerate's DDP communication hook kwargs handler, re-expressed
here): the model is wrapped in ``DistributedDataParallel`` and torch's
``bf16_compress_hook`` or ``fp16_compress_hook`` registered as asked, so the
ranks' gradients are reduced in that precision (a choice of speed over
numerics, which the conformance check reports as a lower-precision
reduction). On torch 2.13 the bfloat16 hook refuses to run without CUDA and
NCCL: the tool says so in one line (a usage error) on gloo.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

__all__ = ["prepare_model"]

_HOOKS = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}


def prepare_model(model: nn.Module, comm_hook: str = "no") -> DistributedDataParallel:
    """A DDP of ``model`` with the comm hook ``comm_hook`` names ("no", "bf16" or "fp16")."""
    ddp = DistributedDataParallel(model)
    if comm_hook != "no":
        ddp.register_comm_hook(state=None, hook=_HOOKS[comm_hook])
    return ddp
