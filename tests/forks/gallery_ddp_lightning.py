"""Gallery wrapper: Lightning's ``DDPStrategy(**ddp_kwargs).setup_module(model)``, in two stages.

Pattern (Lightning's DDP strategy, re-expressed here): the strategy is built
first with its own options and any DDP keywords (kept for later), and the
model is wrapped afterwards by ``setup_module``, on the strategy's device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPStrategy"]


class DDPStrategy:
    """Keeps DDP's keywords; ``setup_module`` wraps a model with them."""

    def __init__(self, process_group_backend: str | None = None, **kwargs: Any) -> None:
        self.process_group_backend = process_group_backend
        self._ddp_kwargs = kwargs

    def setup_module(self, module: nn.Module) -> DistributedDataParallel:
        """``DistributedDataParallel(module, device_ids=..., **ddp_kwargs)``."""
        device_ids = [torch.cuda.current_device()] if next(module.parameters()).is_cuda else None
        return DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)
