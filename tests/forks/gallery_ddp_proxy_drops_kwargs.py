"""Gallery wrapper, broken: a proxy around torch's DDP whose ``forward`` passes positional arguments only.

Bug: ``forward(self, *args, **kwargs)`` returns ``self.module(*args)``; a
model called with keyword arguments loses them (here a TypeError for the
missing keyword-only argument). On a model called positionally it is correct.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Proxy"]


class Proxy(nn.Module):
    """Holds ``DistributedDataParallel(model)`` at ``.module``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = DistributedDataParallel(model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """BUG: the keyword arguments are dropped."""
        return self.module(*args)
