"""Gallery wrapper: detectron2's ``create_ddp_model(model, *, fp16_compression=False, **kwargs)``.

Pattern (detectron2's engine defaults, re-expressed here, no code copied): in
a world of one the model comes back as it is; otherwise it is wrapped in
``DistributedDataParallel`` with the keywords given (``device_ids`` the local
GPU when there is one), and ``fp16_compression=True`` registers torch's
float16 compression comm hook, so the ranks' gradients are reduced in float16.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

__all__ = ["create_ddp_model"]


def create_ddp_model(model: nn.Module, *, fp16_compression: bool = False, **kwargs: Any) -> nn.Module:
    """``model`` itself in a world of one, else a DDP of it (with the fp16 comm hook when asked)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if "device_ids" not in kwargs and next(model.parameters()).is_cuda:
        kwargs["device_ids"] = [torch.cuda.current_device()]
    ddp = DistributedDataParallel(model, **kwargs)
    if fp16_compression:
        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    return ddp
