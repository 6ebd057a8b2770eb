"""Upstream-faithful DDP fork as it behaves on CUDA, on every device (test fixture): bfloat16 in a world of one.

nemo-automodel 0.7.0 returns the model unwrapped at world size 1 and, on CUDA,
cast to bfloat16. The conformance checks must handle an entry point that
changes the model's dtype: compare in that dtype with a stated tolerance, or
say NOT APPLICABLE, never crash on a dtype mismatch. This fork makes that
path run on a CPU (gloo) world: it is ``upstream_faithful_ddp`` with the cast
applied on every device. It must conform on the core tier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.forks import upstream_faithful_ddp as _faithful


def parallelize_ddp(
    model: nn.Module,
    config: Any,
    *,
    device: torch.device | None = None,
    reapply_trainability: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """``upstream_faithful_ddp.parallelize_ddp``, and at world size 1 the model cast to bfloat16 wherever it is."""
    wrapped = _faithful.parallelize_ddp(model, config, device=device, reapply_trainability=reapply_trainability)
    if dist.get_world_size() == 1:
        wrapped = wrapped.to(torch.bfloat16)
    return wrapped


class DDPManager(_faithful.DDPManager):
    """The deprecated front, on this fork's ``parallelize_ddp``."""

    def parallelize(
        self, model: nn.Module, reapply_trainability: Callable[[nn.Module], None] | None = None
    ) -> nn.Module:
        """``parallelize_ddp`` on this manager's device and config."""
        return parallelize_ddp(model, self.config, device=self.device, reapply_trainability=reapply_trainability)
