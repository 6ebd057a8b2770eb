"""Broken DDP fork (test fixture): maps ``broadcast_buffers`` onto ``forward_sync_buffers``.

On torch 2.13 ``forward_sync_buffers=False`` still broadcasts rank 0's buffers at
construction, unlike upstream's ``broadcast_buffers=False`` (docs/contract.md).
Guarded by ``ddp.broadcast_buffers``: with False, rank-local buffers are overwritten.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing
from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import _autocast_forward

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except for the buffer-sync keyword it gives DDP."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap with ``forward_sync_buffers=broadcast_buffers`` (the deliberate bug)."""
        if self.activation_checkpointing:
            apply_activation_checkpointing(model, self.activation_checkpointing, self.activation_checkpointing_scope)
        model = model.to(self.device)
        kwargs: dict[str, Any] = {
            "device_ids": None,
            "find_unused_parameters": self.find_unused_parameters,
            "static_graph": self.static_graph,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
        }
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
            kwargs["forward_sync_buffers"] = self.broadcast_buffers
        else:  # older torch: no such keyword, so this fork's bug cannot exist there
            kwargs["broadcast_buffers"] = self.broadcast_buffers
        if self.bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = self.bucket_cap_mb
        wrapped = DistributedDataParallel(model, **kwargs)
        if self.autocast_dtype is not None:
            _autocast_forward(wrapped, self.device.type, self.autocast_dtype)
        return wrapped
