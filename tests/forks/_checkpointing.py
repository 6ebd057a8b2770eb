"""The entry points of a fork that checkpoints its own way: the checkpointing gallery's shared frame (test data).

A gallery module (``gallery_checkpointing_*``) says only how it checkpoints
one selected block, as ``checkpoint(block, mode)`` (``mode`` is ``"full"`` or
``"selective"``): it returns the module to put in the block's place, or None
where it changed the block in place. :func:`checkpointing_fork` builds from it
every entry point the suites check, each selecting blocks as the contract
does (the layer groups nemo_dist finds, the scope's groups, trainable blocks
only) and then wrapping or sharding through the bundled components with
checkpointing off:

- ``parallelize_ddp`` and ``DDPManager`` (``--ddp MODULE``);
- ``wrap(model, activation_checkpointing=False, activation_checkpointing_scope="all")``,
  a plain ``DistributedDataParallel`` wrapper (``--ddp-fn MODULE:wrap``);
- ``FSDP2Manager`` and ``fsdp2_strategy_parallelize`` (``--fsdp2 MODULE``).

Also the policy helpers the gallery shares: :func:`op_policy` (a
selective-checkpoint context from a function of the op), the matmul ops and
:data:`save_matmuls`, the save-matmuls policy's context.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["MATMULS", "checkpointing_fork", "is_matmul", "op_policy", "save_matmuls", "select_blocks"]

_aten = torch.ops.aten
#: The matmul ops a linear layer or an attention product runs, as overloads' packets.
MATMULS = frozenset({_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm})

Checkpoint = Callable[[nn.Module, str], "nn.Module | None"]


def is_matmul(op: Any) -> bool:
    """Whether aten overload ``op`` (``aten.mm.default``) is one of :data:`MATMULS`."""
    return getattr(op, "overloadpacket", op) in MATMULS


def op_policy(choose: Callable[[Any, Any], CheckpointPolicy]) -> Callable[[], Any]:
    """A ``context_fn`` for torch's checkpoint: a selective-checkpoint context whose policy is ``choose(ctx, op)``."""
    return functools.partial(create_selective_checkpoint_contexts, lambda ctx, op, *args, **kwargs: choose(ctx, op))


def _matmuls_saved(ctx: object, op: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if is_matmul(op) else CheckpointPolicy.PREFER_RECOMPUTE


#: The ``context_fn`` of the save-matmuls policy: every matmul's output saved, every other op recomputed.
save_matmuls = op_policy(_matmuls_saved)


def select_blocks(model: nn.Module, scope: Any) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, attribute, block)`` of each trainable block of the groups ``scope`` names, in model order."""
    from nemo_dist.distributed.activation_checkpointing import find_layer_groups
    from nemo_dist.distributed.config import DDPConfig

    names = DDPConfig(activation_checkpointing_scope=scope).activation_checkpointing_scope
    groups = find_layer_groups(model)
    wanted = set(groups) if "all" in names else {
        g for name in names for g in (("vision", "audio") if name == "multimodal" else (name,))
    }
    chosen = {id(b) for group, blocks in groups.items() if group in wanted for b in blocks}
    found = []
    for parent in model.modules():
        for attribute, child in parent.named_children():
            if id(child) in chosen and any(p.requires_grad for p in child.parameters()):
                found.append((parent, attribute, child))
    return found


Select = Callable[[nn.Module, Any], "list[tuple[nn.Module, str, nn.Module]]"]


def _apply(checkpoint: Checkpoint, select: Select, model: nn.Module, mode: Any, scope: Any) -> None:
    if not mode:
        return
    kind = "selective" if mode == "selective" else "full"
    for parent, attribute, block in select(model, scope):
        replacement = checkpoint(block, kind)
        if replacement is not None:
            setattr(parent, attribute, replacement)


def checkpointing_fork(checkpoint: Checkpoint, doc: str, select: Select = select_blocks) -> tuple[Any, ...]:
    """Every entry point of a fork checkpointing each selected block with ``checkpoint`` (module docstring).

    ``select(model, scope)`` chooses the blocks (:func:`select_blocks` unless a broken fork says otherwise).
    Returns ``(parallelize_ddp, DDPManager, wrap, FSDP2Manager, fsdp2_strategy_parallelize)``.
    """
    from nemo_dist.distributed import ddp as reference
    from nemo_dist.distributed import fsdp2 as fsdp2_reference
    from tests.forks import fsdp2_fork

    def parallelize_ddp(model: nn.Module, config: Any, *, device: torch.device | None = None) -> nn.Module:
        _apply(checkpoint, select, model, config.activation_checkpointing, config.activation_checkpointing_scope)
        unchanged = dataclasses.replace(config, activation_checkpointing=False)
        return reference.parallelize_ddp(model, unchanged, device=device)

    parallelize_ddp.__doc__ = f"The reference's parallelize_ddp, checkpointing its own way: {doc}"

    class DDPManager(reference.DDPManager):
        __doc__ = f"The reference manager, checkpointing its own way: {doc}"

        def parallelize(self, model: nn.Module) -> nn.Module:
            """Wrap through the fork's ``parallelize_ddp``."""
            return parallelize_ddp(model, self.config, device=self.device)

    def wrap(
        model: nn.Module, activation_checkpointing: bool | str = False, activation_checkpointing_scope: Any = "all"
    ) -> nn.Module:
        _apply(checkpoint, select, model, activation_checkpointing, activation_checkpointing_scope)
        return torch.nn.parallel.DistributedDataParallel(model)

    wrap.__doc__ = f"torch's DistributedDataParallel around the model, checkpointed first: {doc}"

    def _parallelize(model: nn.Module, config: Any, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
        _apply(checkpoint, select, model, config.activation_checkpointing, config.activation_checkpointing_scope)
        unchanged = dataclasses.replace(config, activation_checkpointing=False)
        return fsdp2_reference._parallelize(model, unchanged, device_mesh, reapply_trainability)

    manager, strategy = fsdp2_fork(_parallelize, f"The reference FSDP2 manager, checkpointing its own way: {doc}")
    return parallelize_ddp, DDPManager, wrap, manager, strategy
