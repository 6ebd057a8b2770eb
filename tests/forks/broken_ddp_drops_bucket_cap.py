"""Broken DDP fork (test fixture): ``bucket_cap_mb`` is never forwarded to DDP.

Guarded by ``ddp.bucket_cap_mb``: a small cap gives as many buckets as a large one.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that DDP always gets torch's default bucket size."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap like the reference but drop ``bucket_cap_mb`` (the deliberate bug)."""
        return parallelize_ddp(model, dataclasses.replace(self.config, bucket_cap_mb=None), device=self.device)
