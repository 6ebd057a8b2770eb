"""Activation checkpointing of a model's layer blocks, chosen by layer group.

Layer groups follow the upstream convention: the blocks of ``model.model.layers``
or ``model.layers`` are the ``language`` group; multimodal models name theirs
(``language_model``, ``visual``/``vision_tower``, ``audio_tower``), each tower's
blocks being its largest ``ModuleList``/``ModuleDict``; a model with none of
these has its largest ``ModuleList``/``ModuleDict`` as the ``language`` group.

Each selected block with a trainable parameter is replaced in place by torch's
non-reentrant ``checkpoint_wrapper``; ``"selective"`` gives the wrapper a
selective-checkpoint context that keeps matmul outputs and recomputes the rest.
Either way the block's ``forward`` runs again during backward.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["apply_activation_checkpointing", "find_layer_groups"]

_Container = nn.ModuleList | nn.ModuleDict

_VISION_TOWERS = ("visual", "vision_tower", "vision_model", "vision_encoder")
_AUDIO_TOWERS = ("audio_tower", "audio_model", "audio_encoder")
_LANGUAGE_PATHS = ("model.layers", "layers", "language_model.layers", "language_model.model.layers")

# Outputs of these ops are kept under selective checkpointing; the rest is recomputed.
_SAVED_OPS = {
    op
    for op in (
        getattr(torch.ops.aten, name, None)
        for name in ("mm", "addmm", "bmm", "baddbmm", "linear", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    )
    if op is not None
}


def _get(module: nn.Module, path: str) -> nn.Module | None:
    for name in path.split("."):
        child = getattr(module, name, None)
        if not isinstance(child, nn.Module):
            return None
        module = child
    return module


def _largest_container(module: nn.Module) -> _Container | None:
    containers = [m for m in module.modules() if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m)]
    if not containers:
        return None
    return max(containers, key=lambda c: sum(p.numel() for p in c.parameters()))


def _roots(model: nn.Module) -> Iterator[nn.Module]:
    yield model
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module):
        yield inner


def _tower(model: nn.Module, names: Iterable[str]) -> _Container | None:
    for root in _roots(model):
        for name in names:
            tower = _get(root, name)
            if tower is not None:
                return _largest_container(tower)
    return None


def find_layer_groups(model: nn.Module) -> dict[str, _Container]:
    """Map each layer group present in ``model`` to the container of its blocks.

    Keys are among "language", "vision" and "audio"; a model with no recognised
    layout maps "language" to its largest ModuleList/ModuleDict (by parameter
    count), and a model with no container at all maps nothing.
    """
    groups: dict[str, _Container] = {}
    for root in _roots(model):
        for path in _LANGUAGE_PATHS:
            found = _get(root, path)
            if isinstance(found, (nn.ModuleList, nn.ModuleDict)):
                groups["language"] = found
                break
        if "language" in groups:
            break
    if "language" not in groups:
        for root in _roots(model):
            language_model = getattr(root, "language_model", None)
            if isinstance(language_model, nn.Module):
                container = _largest_container(language_model)
                if container is not None:
                    groups["language"] = container
                    break
    vision = _tower(model, _VISION_TOWERS)
    if vision is not None:
        groups["vision"] = vision
    audio = _tower(model, _AUDIO_TOWERS)
    if audio is not None:
        groups["audio"] = audio
    if not groups:
        largest = _largest_container(model)
        if largest is not None:
            groups["language"] = largest
    return groups


def _selected(scope: tuple[str, ...]) -> set[str]:
    if "all" in scope:
        return {"language", "vision", "audio"}
    names = set(scope)
    if "multimodal" in names:
        names |= {"vision", "audio"}
    return names - {"multimodal"}


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _wrap(block: nn.Module, mode: str) -> nn.Module:
    if mode == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
        return checkpoint_wrapper(block, context_fn=context_fn)
    return checkpoint_wrapper(block)


def apply_activation_checkpointing(
    model: nn.Module, mode: bool | str = "full", scope: Iterable[str] = ("all",)
) -> list[nn.Module]:
    """Wrap the blocks of the selected layer groups of ``model`` in place.

    ``mode`` is True/"full" or "selective" (False does nothing); ``scope`` is a
    normalised scope tuple as ``DDPConfig`` makes it.  Blocks with no trainable
    parameter and blocks already wrapped are left alone.  Returns the blocks
    that were wrapped (the original modules, now inside their wrappers).
    """
    if mode is False:
        return []
    kind = "selective" if mode == "selective" else "full"
    wanted = _selected(tuple(scope))
    wrapped: list[nn.Module] = []
    for group, container in find_layer_groups(model).items():
        if group not in wanted:
            continue
        keys: Iterable[Any] = container.keys() if isinstance(container, nn.ModuleDict) else range(len(container))
        for key in list(keys):
            block = container[key]
            if isinstance(block, CheckpointWrapper):
                continue
            if not any(p.requires_grad for p in block.parameters()):
                continue
            container[key] = _wrap(block, kind)
            wrapped.append(block)
    return wrapped
