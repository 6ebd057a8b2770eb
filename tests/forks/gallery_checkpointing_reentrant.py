"""Checkpointing gallery: full checkpointing by the reentrant implementation (``use_reentrant=True``).

Pattern (torch's older, reentrant checkpoint, still the default of many
trainers): ``checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.REENTRANT)``.
Reentrant checkpointing gives the parameters inside no gradient when no
input of the region requires grad, so each wrapped block's tensor input is
made to require it (what Hugging Face's ``enable_input_require_grads`` does
for the embedding output). It has no selective contexts: selective is the
documented save-matmuls policy, non-reentrant. Correct: it conforms.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from tests.forks._checkpointing import checkpointing_fork, save_matmuls

__all__ = ["DDPManager", "FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx",
           "parallelize_ddp", "wrap"]


def _input_requires_grad(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    first = args[0]
    if not first.requires_grad and first.is_floating_point():
        first = first.detach().requires_grad_()
    return (first, *args[1:])


def _checkpoint(block: nn.Module, mode: str) -> nn.Module:
    if mode == "selective":
        return checkpoint_wrapper(block, context_fn=save_matmuls)
    wrapper = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.REENTRANT)
    wrapper.register_forward_pre_hook(_input_requires_grad)
    return wrapper


parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize = checkpointing_fork(
    _checkpoint, 'full checkpointing by the reentrant implementation, inputs made to require grad'
)
