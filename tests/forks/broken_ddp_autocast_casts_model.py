"""Broken DDP fork (test fixture): ``autocast_dtype`` casts the whole model to that dtype instead of autocasting.

Guarded by ``ddp.autocast_dtype``: under autocast the parameters (and so their
gradients) stay float32; only the ops run in the autocast dtype.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that the model is cast to ``autocast_dtype``."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Cast the model to ``autocast_dtype`` and wrap it without autocast (the deliberate bug)."""
        if self.autocast_dtype is not None:
            model = model.to(self.autocast_dtype)
        return parallelize_ddp(model, dataclasses.replace(self.config, autocast_dtype=None), device=self.device)
