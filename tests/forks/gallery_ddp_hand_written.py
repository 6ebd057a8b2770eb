"""Gallery wrapper: a hand-written data parallel that all-reduces gradients in hooks.

Pattern (the "minimal DDP" of tutorials and small trainers, re-expressed
here): at construction every parameter and buffer is broadcast from rank 0;
a post-accumulate-grad hook on each parameter all-reduces its gradient (a
sum, then divided by the world size) as backward produces it, unless
``no_sync()`` is active, under which gradients only accumulate locally (the
first synced backward then reduces the accumulated sum). The broken
variants in ``gallery_ddp_*`` override one step each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DataParallel"]


class DataParallel(nn.Module):
    """``module`` kept identical on every rank by broadcasting at start and averaging gradients in hooks."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.syncing = True
        self.start()
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def start(self) -> None:
        """Broadcast every parameter and buffer from rank 0."""
        for tensor in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def _hook(self, param: torch.Tensor) -> None:
        if self.syncing and param.grad is not None:
            param.grad = self.reduce(param.grad)
        else:
            self.skipped(param)

    def reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """The average of ``grad`` over the ranks."""
        dist.all_reduce(grad)
        return grad.div_(dist.get_world_size())

    def skipped(self, param: torch.Tensor) -> None:
        """Under ``no_sync``: nothing (the gradient accumulates locally)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True
