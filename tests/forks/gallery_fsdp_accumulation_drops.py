"""Gallery wrapper, broken: FSDP2 whose gradient-accumulation switch clears the micro-batches accumulated so far.

Bug, as written to save all-gathers and memory: ``set_requires_gradient_sync``
is replaced by one that also keeps the parameters unsharded while
accumulating (``set_reshard_after_backward(False)``, the use FSDP's
documentation gives it), and, when sync is turned back on, calls
``zero_grad(set_to_none=True)``, the author taking that moment for the start
of a new step, where a trainer clears its gradients. But sync is turned back
on for the last micro-batch, before its backward: the gradients cleared are
the unsharded ones the earlier micro-batches accumulated, not yet reduced,
so the step keeps only the last micro-batch's gradient (the class of a
trainer calling ``zero_grad`` inside its micro-batch loop, and of
Megatron-LM's FSDP v2 clearing its accumulation buffer at every micro-batch
until its pull request 7186).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_fsdp"]


def apply_fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` block by block, averaged; BUG: re-enabling sync drops the accumulated gradients."""
    sharded = shard_blocks_then_root(model, mesh)

    def set_requires_gradient_sync(requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        FSDPModule.set_requires_gradient_sync(sharded, requires_gradient_sync, recurse=recurse)
        sharded.set_reshard_after_backward(requires_gradient_sync, recurse=recurse)
        if requires_gradient_sync:
            model.zero_grad(set_to_none=True)  # BUG: clears the unsharded, still unreduced, accumulated gradients

    sharded.set_requires_gradient_sync = set_requires_gradient_sync  # type: ignore[method-assign]
    return model
