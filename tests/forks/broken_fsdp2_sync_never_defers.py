"""Broken FSDP2 fork (test fixture): ``get_sync_ctx`` always turns gradient sync on for an FSDP module (upstream #3679).

Guarded by ``fsdp2.deferred_sync_reduces_on_the_last_micro_batch``: with
sync deferred (``is_optim_step`` False, ``defer_fsdp_grad_sync`` True) a
micro-batch must not reduce gradients; here every micro-batch's backward
reduces (the final gradients are still right, only the deferral is lost).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, FSDP2Manager, fsdp2_strategy_parallelize

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def get_sync_ctx(
    model: nn.Module, is_optim_step: bool, defer_fsdp_grad_sync: bool = True
) -> AbstractContextManager[Any]:
    """The reference's, except that an FSDP module always gets gradient sync on (the deliberate bug)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(True)
        return nullcontext()
    return _reference.get_sync_ctx(model, is_optim_step, defer_fsdp_grad_sync)
