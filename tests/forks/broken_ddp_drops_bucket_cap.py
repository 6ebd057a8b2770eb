"""Broken DDP fork (test fixture): ``bucket_cap_mb`` is never forwarded to DDP.

Guarded by ``ddp.bucket_cap_mb``: a small cap gives as many buckets as a large one.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that DDP always gets torch's default bucket size."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap like the reference but drop ``bucket_cap_mb`` (the deliberate bug)."""
        cap, self.bucket_cap_mb = self.bucket_cap_mb, None
        try:
            return super().parallelize(model)
        finally:
            self.bucket_cap_mb = cap
