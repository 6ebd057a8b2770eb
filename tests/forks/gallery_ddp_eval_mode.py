"""Gallery wrapper, broken: wraps the model in DDP after putting it in eval mode.

Bug: ``model.eval()`` before wrapping (copied from an inference path):
dropout stops dropping and batch norm stops updating its statistics during
training. The gradients of a model without either are still right.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["eval_ddp"]


def eval_ddp(model: nn.Module) -> DistributedDataParallel:
    """BUG: ``DistributedDataParallel(model.eval())``."""
    return DistributedDataParallel(model.eval())
