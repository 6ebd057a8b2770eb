"""Activation checkpointing of a model's layer blocks, chosen by layer group.

A layer group ("language", "vision" or "audio") is a list of blocks in model
order.  :func:`find_layer_groups` chooses them as NeMo Automodel 0.7.0 does:

1. A model attribute ``parallel_layer_groups`` (group name -> candidate dotted
   paths) is followed as upstream follows it: each group takes the first
   candidate that yields blocks (a ``ModuleList``/``ModuleDict`` yields its
   entries, any other module is one block); a group none of whose candidates
   yields blocks is absent, and nothing else is looked at.
2. Otherwise the layout registered for the model's class name.  The entries
   carry the facts of upstream's layer-group table (which upstream's loader
   attaches to its wrapper classes as ``parallel_layer_groups``), so the
   ``transformers`` classes it names (Gemma3, the Llava family, Mistral3,
   Llama4, GPT2, Qwen2-VL, Qwen2.5-VL, SmolVLM, ...) get the same blocks as
   under upstream's loader.
3. Otherwise structural discovery, upstream's rule: every non-empty
   ``ModuleList``, and every ``ModuleDict`` whose keys are all digits, is a
   candidate; a candidate whose dotted path has a component among
   ``audio``, ``audio_model``, ``audio_tower``, ``audio_encoder`` is audio,
   else among ``image_encoder``, ``vision``, ``vision_model``,
   ``vision_tower``, ``visual``, ``vit_model`` vision, else language; each
   group takes its candidate with the most entries (ties: fewest dots, then
   the first met).  A model with no candidate has no groups.

Beyond upstream (each difference is asserted in
``tests/distributed/test_layer_groups_transformers.py`` against upstream's own code):

- Whisper (``WhisperForConditionalGeneration``, ``WhisperModel``,
  ``WhisperForAudioClassification``): the encoder stack is the "audio" group
  and the decoder stack the "language" group.  Upstream's discovery finds no
  audio word in ``model.encoder.layers``, files both stacks under "language"
  and keeps the one with more blocks (the encoder when the depths are equal,
  as in whisper-large), so the other stack is never checkpointed and scope
  "audio" selects nothing.
- Layouts whose paths moved in transformers 5 (``Step3p7ForConditionalGeneration``:
  vision at ``model.vision_model.layers``; ``MiniMaxM3SparseForConditionalGeneration``:
  language and vision under ``model.language_model`` and ``model.vision_tower``):
  upstream's loader leaves such a group out (it logs a warning) and checkpoints
  none of its blocks; here a group of the layout whose paths resolve nothing
  is taken from structural discovery, and a layout that resolves nothing at
  all gives way to discovery entirely.

:func:`apply_activation_checkpointing` replaces each selected block, in its
parent, by torch's non-reentrant ``checkpoint_wrapper``; ``"selective"`` gives
the wrapper a selective-checkpoint context that keeps matmul outputs and
recomputes the rest.  Either way the block's ``forward`` runs again during
backward.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["apply_activation_checkpointing", "find_layer_groups"]

#: Group name -> candidate dotted paths of its blocks, tried in order.
_Layout = Mapping[str, tuple[str, ...]]

# Shared layouts of several classes.  Older transformers releases kept some
# towers elsewhere; the later candidates name those places.
_TEXT_IN_LANGUAGE_MODEL: _Layout = {"language": ("model.language_model.layers",)}
_LLAVA_LIKE: _Layout = {
    "language": ("model.language_model.layers", "language_model.model.layers"),
    "vision": (
        "model.vision_tower.vision_model.encoder.layers",
        "model.vision_tower.encoder.layers",
        "vision_tower.vision_model.encoder.layers",
    ),
}
_MISTRAL3_LIKE: _Layout = {
    "language": ("model.language_model.layers",),
    "vision": (
        "model.vision_tower.encoder.layers",
        "model.vision_tower.vision_model.encoder.layers",
        "model.vision_tower.transformer.layers",
    ),
}
_QWEN_VL_LIKE: _Layout = {
    "language": ("model.language_model.layers", "model.layers"),
    "vision": ("model.visual.blocks", "visual.blocks"),
}
_QWEN3_VL_LIKE: _Layout = {**_TEXT_IN_LANGUAGE_MODEL, "vision": ("model.visual.blocks",)}
_KIMI_VL_LIKE: _Layout = {**_TEXT_IN_LANGUAGE_MODEL, "vision": ("model.vision_tower.encoder.blocks",)}

#: The layouts upstream's loader attaches by class name (NeMo Automodel 0.7.0).
_UPSTREAM_LAYOUTS: dict[str, _Layout] = {
    # transformers classes
    "GPT2LMHeadModel": {"language": ("transformer.h",)},
    "Gemma3ForConditionalGeneration": _LLAVA_LIKE,
    "Gemma4ForConditionalGeneration": _TEXT_IN_LANGUAGE_MODEL,
    "Llama4ForConditionalGeneration": {
        "language": ("language_model.model.layers",),
        "vision": ("vision_model.model.layers",),
    },
    "LlavaForConditionalGeneration": _LLAVA_LIKE,
    "LlavaNextForConditionalGeneration": _LLAVA_LIKE,
    "LlavaNextVideoForConditionalGeneration": _LLAVA_LIKE,
    "LlavaOnevisionForConditionalGeneration": _LLAVA_LIKE,
    "MiniMaxM3SparseForConditionalGeneration": {
        "language": ("model.layers",),
        "vision": ("vision_tower.vision_model.encoder.layers",),
    },
    "Mistral3ForConditionalGeneration": _MISTRAL3_LIKE,
    "NemotronHForCausalLM": {"language": ("backbone.layers", "model.layers")},
    "Qwen2VLForConditionalGeneration": _QWEN_VL_LIKE,
    "Qwen2_5_VLForConditionalGeneration": _QWEN_VL_LIKE,
    "Qwen3VLMoeForConditionalGeneration": _QWEN3_VL_LIKE,
    "Qwen3_5ForConditionalGeneration": _QWEN3_VL_LIKE,
    "Qwen3_5MoeForConditionalGeneration": _QWEN3_VL_LIKE,
    "SmolVLMForConditionalGeneration": {
        "language": ("model.text_model.layers",),
        "vision": ("model.vision_model.encoder.layers",),
    },
    "Step3p7ForConditionalGeneration": {
        "language": ("model.language_model.layers",),
        "vision": ("model.vision_model.transformer.resblocks",),
    },
    # classes of upstream's own model implementations (and remote-code models)
    "BagelForUnifiedMultimodal": {
        "language": ("model.language_model.model.layers",),
        "vision": ("model.vit_model.vision_model.encoder.layers",),
    },
    "DeepseekV4ForCausalLM": {"language": ("model.layers",), "vision": ("model.vision.blocks",)},
    "KimiK25VLForConditionalGeneration": _KIMI_VL_LIKE,
    "KimiVLForConditionalGeneration": _KIMI_VL_LIKE,
    "LlamaNemotronVLModel": {
        "language": ("language_model.layers",),
        "vision": ("vision_model.vision_model.encoder.layers", "vision_model.encoder.layers"),
    },
    "Ministral3BidirectionalModel": {"language": ("layers",)},
    "Mistral3FP8VLMForConditionalGeneration": _MISTRAL3_LIKE,
}

#: Layouts upstream does not register, for architectures its discovery mis-groups.
_BEYOND_UPSTREAM_LAYOUTS: dict[str, _Layout] = {
    "WhisperForConditionalGeneration": {"audio": ("model.encoder.layers",), "language": ("model.decoder.layers",)},
    "WhisperModel": {"audio": ("encoder.layers",), "language": ("decoder.layers",)},
    "WhisperForAudioClassification": {"audio": ("encoder.layers",)},
}

_LAYOUTS: dict[str, _Layout] = {**_UPSTREAM_LAYOUTS, **_BEYOND_UPSTREAM_LAYOUTS}

_AUDIO_WORDS = frozenset({"audio", "audio_model", "audio_tower", "audio_encoder"})
_VISION_WORDS = frozenset({"image_encoder", "vision", "vision_model", "vision_tower", "visual", "vit_model"})

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


def _resolve(model: nn.Module, path: str) -> Any:
    """Follow ``path`` by attribute access from ``model``; None where a step is missing."""
    found: Any = model
    for name in path.split("."):
        found = getattr(found, name, None)
        if found is None:
            return None
    return found


def _blocks_at(model: nn.Module, paths: Iterable[str]) -> list[nn.Module]:
    """The blocks of the first of ``paths`` that yields any; [] when none does."""
    for path in paths:
        found = _resolve(model, path)
        if found is None:
            continue
        if isinstance(found, nn.ModuleList):
            blocks = list(found)
        elif isinstance(found, nn.ModuleDict):
            blocks = list(found.values())
        elif isinstance(found, nn.Module):
            blocks = [found]
        else:
            raise TypeError(
                f"layer-group path {path!r} of {type(model).__name__} leads to a {type(found).__name__}, not a module"
            )
        if blocks:
            return blocks
    return []


def _from_layout(model: nn.Module, layout: Mapping[str, Iterable[str]]) -> dict[str, list[nn.Module]]:
    """The groups of ``layout`` that resolve on ``model``, in the layout's order."""
    groups: dict[str, list[nn.Module]] = {}
    for group, paths in layout.items():
        blocks = _blocks_at(model, paths)
        if blocks:
            groups[group] = blocks
    return groups


def _is_block_container(module: nn.Module) -> TypeGuard[nn.ModuleList | nn.ModuleDict]:
    """A ModuleList, or a ModuleDict whose keys are all digits (upstream's candidates)."""
    if isinstance(module, nn.ModuleList):
        return True
    return isinstance(module, nn.ModuleDict) and all(key.isdigit() for key in module)


def _group_of(path: str) -> str:
    """Upstream's keyword rule: audio words win over vision words; anything else is language."""
    words = set(path.lower().split("."))
    if words & _AUDIO_WORDS:
        return "audio"
    if words & _VISION_WORDS:
        return "vision"
    return "language"


def _discover(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Upstream's structural discovery: per group, the block container with the most entries."""
    best: dict[str, tuple[tuple[int, int], nn.ModuleList | nn.ModuleDict]] = {}
    for path, module in model.named_modules():
        if not _is_block_container(module) or len(module) == 0:
            continue
        group = _group_of(path)
        rank = (len(module), -path.count("."))
        if group not in best or rank > best[group][0]:
            best[group] = (rank, module)
    return {
        group: list(container.values()) if isinstance(container, nn.ModuleDict) else list(container)
        for group, (_, container) in best.items()
    }


def find_layer_groups(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Map each layer group of ``model`` to its blocks, in model order.

    Keys are among "language", "vision" and "audio"; a group is present only
    with at least one block.  The choice follows the module docstring: the
    model's ``parallel_layer_groups`` if it has one (a path leading to
    something that is not a module raises ``TypeError``), else the layout
    registered for its class name, else structural discovery.  A model with
    no ``ModuleList`` and no digit-keyed ``ModuleDict`` maps nothing.
    """
    declared = getattr(model, "parallel_layer_groups", None)
    if declared is not None:
        return _from_layout(model, declared)
    layout = _LAYOUTS.get(type(model).__name__)
    if layout is None:
        return _discover(model)
    groups = _from_layout(model, layout)
    if not groups:
        return _discover(model)
    missing = [group for group in layout if group not in groups]
    if missing:
        discovered = _discover(model)
        for group in missing:
            if group in discovered:
                groups[group] = discovered[group]
    return groups


def _selected_blocks(groups: dict[str, list[nn.Module]], scope: tuple[str, ...]) -> list[nn.Module]:
    """Blocks of the groups ``scope`` names, each once, in scope then model order."""
    if "all" in scope:
        chosen = [block for blocks in groups.values() for block in blocks]
    else:
        chosen = []
        for name in scope:
            for group in ("vision", "audio") if name == "multimodal" else (name,):
                chosen.extend(groups.get(group, []))
    return list({id(block): block for block in chosen}.values())


def _parents(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """id(module) -> every (parent, attribute name) under which ``model`` holds it."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for parent in model.modules():
        for name, child in parent._modules.items():
            if child is not None:
                slots.setdefault(id(child), []).append((parent, name))
    return slots


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    # The policy is given an overload (aten.mm.default); _SAVED_OPS holds overload packets (aten.mm).
    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


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
    normalised scope tuple as ``DDPConfig`` makes it: "all" selects every group
    :func:`find_layer_groups` finds, "multimodal" vision and audio, other names
    their group.  Each selected block is replaced, wherever the model holds it,
    by one non-reentrant ``checkpoint_wrapper``; blocks with no trainable
    parameter and blocks that already are checkpoint wrappers are left alone.
    Returns the blocks that were wrapped (the original modules, now inside
    their wrappers), in selection order.
    """
    if mode is False:
        return []
    kind = "selective" if mode == "selective" else "full"
    blocks = _selected_blocks(find_layer_groups(model), tuple(scope))
    parents = _parents(model)
    wrapped: list[nn.Module] = []
    for block in blocks:
        if isinstance(block, CheckpointWrapper) or not any(p.requires_grad for p in block.parameters()):
            continue
        slots = parents.get(id(block), [])
        if not slots:
            continue
        wrapper = _wrap(block, kind)
        for parent, name in slots:
            setattr(parent, name, wrapper)
        wrapped.append(block)
    return wrapped
