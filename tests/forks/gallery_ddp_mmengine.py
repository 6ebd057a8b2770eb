"""Gallery wrapper: mmengine's ``MMDistributedDataParallel(module, **kwargs)``, a DDP subclass.

Pattern (mmengine's model wrappers, re-expressed here): a subclass of
``DistributedDataParallel`` constructed with the model and DDP's keywords,
adding its own step methods (``train_step``) that a trainer calls instead
of ``forward``; training through ``forward`` is plain DDP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["MMDistributedDataParallel"]


class MMDistributedDataParallel(DistributedDataParallel):
    """DDP of ``module`` with DDP's keywords, plus a trainer-facing ``train_step``."""

    def __init__(self, module: nn.Module, detect_anomalous_params: bool = False, **kwargs: Any) -> None:
        super().__init__(module=module, **kwargs)
        self.detect_anomalous_params = detect_anomalous_params

    def train_step(self, data: torch.Tensor) -> torch.Tensor:
        """The trainer's step: the loss of ``data`` (the mean of the squared outputs)."""
        return self(data).square().mean()
