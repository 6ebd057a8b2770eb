"""Gallery wrapper: a Megatron-core style data parallel that is no DDP: ``main_grad`` and a finishing call.

Pattern (Megatron-core's ``DistributedDataParallel(config, module)``,
re-expressed here): the wrapper is a plain module; each parameter gets a
``main_grad`` buffer, and a hook moves every gradient into it (leaving
``param.grad`` None). Nothing is reduced in backward: the trainer calls
``finish_grad_sync()`` after the last backward of a step (it all-reduces
``main_grad``, averaged over the ranks) and ``zero_grad_buffer()`` before
the next. ``no_sync()`` marks micro-batches that only accumulate. Parameters
are broadcast from rank 0 at construction. Check it with
``--ddp-after-backward finish_grad_sync --ddp-grad-attr main_grad
--ddp-zero-grad zero_grad_buffer``; without the finishing call the
gradients are never reduced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(nn.Module):
    """Gradients gathered in ``param.main_grad``, reduced by ``finish_grad_sync``."""

    def __init__(self, ddp_config: dict[str, Any], module: nn.Module) -> None:
        super().__init__()
        self.ddp_config = dict(ddp_config)
        self.module = module
        self._syncing = True
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
            if p.requires_grad:
                p.main_grad = torch.zeros_like(p)  # type: ignore[attr-defined]
                p.register_post_accumulate_grad_hook(self._into_main_grad)

    @staticmethod
    def _into_main_grad(param: torch.Tensor) -> None:
        param.main_grad.add_(param.grad)  # type: ignore[attr-defined]
        param.grad = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Micro-batches inside only accumulate (the finishing call is the caller's, after the last)."""
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True

    def finish_grad_sync(self) -> None:
        """All-reduce every ``main_grad`` and average it over the ranks."""
        for p in self.module.parameters():
            if p.requires_grad:
                dist.all_reduce(p.main_grad)  # type: ignore[attr-defined]
                p.main_grad.div_(dist.get_world_size())  # type: ignore[attr-defined]

    def zero_grad_buffer(self) -> None:
        """Zero every ``main_grad`` for the next step."""
        for p in self.module.parameters():
            if p.requires_grad:
                p.main_grad.zero_()  # type: ignore[attr-defined]
