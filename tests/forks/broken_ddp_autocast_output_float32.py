"""Broken DDP fork (test fixture): ``autocast_dtype`` runs the forward under autocast, then casts the output to float32.

Guarded by ``ddp.autocast_dtype``: every matmul runs in the autocast dtype, but
the output is float32, where ``torch.autocast``'s forward of the same model
returns the autocast dtype (a caller reading the output's dtype is misled).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, with each output cast to float32 after the autocast forward."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap as the reference does, then cast what forward returns to float32 (the deliberate bug)."""
        wrapped = super().parallelize(model)
        if self.autocast_dtype is not None:
            forward = wrapped.forward

            def float_output(*args: Any, **kwargs: Any) -> Any:
                return forward(*args, **kwargs).to(torch.float32)

            wrapped.forward = float_output  # type: ignore[method-assign]
        return wrapped
