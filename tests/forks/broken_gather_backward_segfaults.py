"""Broken gather fork: the backward crashes its own process (SIGSEGV), as heap corruption in a native op would.

Otherwise ``upstream_style_gather``. The conformance suite must report a
crash of that rank ("rank R crashed: killed by signal SIGSEGV") with its
stderr tail, and no gradient likely cause over it.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

from tests.forks.upstream_style_gather import _active, _AllGatherWithGrad, all_gather_no_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


class _CrashingBackward(_AllGatherWithGrad):
    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGSEGV)  # BUG: stands for an in-place write that corrupts the heap
        return _AllGatherWithGrad.backward(ctx, *grads)


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Gather ``x`` across ranks on dim 0 while preserving autograd."""
    if not _active():
        return x
    return torch.cat(_CrashingBackward.apply(x), dim=0)
