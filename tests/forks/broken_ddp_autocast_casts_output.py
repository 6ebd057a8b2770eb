"""Broken DDP fork (test fixture): ``autocast_dtype`` casts only the wrapped model's output.

Guarded by ``ddp.autocast_dtype``: the output has the autocast dtype, but every
matmul ran in float32; autocast runs them in its dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
from nemo_dist.distributed.ddp import parallelize_ddp

__all__ = ["DDPManager"]


class DDPManager(_ReferenceManager):
    """The reference manager, except that autocast is replaced by a cast of the output."""

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap without autocast, then cast what forward returns (the deliberate bug)."""
        wrapped = parallelize_ddp(model, dataclasses.replace(self.config, autocast_dtype=None), device=self.device)
        dtype = self.autocast_dtype
        if dtype is not None:
            forward = wrapped.forward

            def cast_output(*args: Any, **kwargs: Any) -> Any:
                return forward(*args, **kwargs).to(dtype)

            wrapped.forward = cast_output  # type: ignore[method-assign]
        return wrapped
