"""Gallery wrapper: yolov5's ``smart_DDP(model)``.

Pattern (yolov5's torch utilities, re-expressed here): no knobs at all; the
model is wrapped in ``DistributedDataParallel`` with ``static_graph=True``
(on the torch versions that have it), on the local GPU when there is one.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["smart_DDP"]


def smart_DDP(model: nn.Module) -> DistributedDataParallel:  # the public pattern's name
    """A static-graph DDP of ``model``."""
    device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
    return DistributedDataParallel(model, device_ids=device_ids, static_graph=True)
