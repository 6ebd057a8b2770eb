"""Gallery wrapper: DDP of a model first cast to float32, as trainers keeping float32 master weights do.

Pattern (mixed-precision trainers that call ``model.float()`` before wrapping,
re-expressed here): the model's parameters become float32 whatever they
were, then the model is wrapped in ``DistributedDataParallel``. Training
stays correct in float32; the changed dtype is what the checks report
(``wrapper.keeps_dtype``, extended).
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["float32_ddp"]


def float32_ddp(model: nn.Module) -> DistributedDataParallel:
    """A DDP of ``model`` cast to float32."""
    return DistributedDataParallel(model.float())
