"""Rank-side functions of the checkpointing checks on real ``transformers`` models.

Each architecture of :data:`ARCHITECTURES` is a tiny model of a real
``transformers`` class, built on CPU from a tiny config (random init under
``torch.manual_seed``, so every rank builds the same weights; nothing is
downloaded), cast to float64. Next to its builder it carries the facts the
checks assert against: which layer groups it has and the dotted path of the
container of each group's blocks (measured on transformers 5.24, as in
``tests/distributed/test_layer_groups_transformers.py``), the block it freezes, and
how to drive every group's tower with synthetic inputs so each block runs:
the full model on ``input_ids`` for the language group, the vision tower on
pixel patches, the audio encoder on input features.

`recompute_counts` counts, per block, how often its attention and
(where the block has one) its MLP run forward during backward, by replacing
the instance ``forward`` of those sub-modules before wrapping (forward hooks
do not fire on a checkpoint's recompute; a call through ``__call__`` always
reaches the instance ``forward``). It works whether the implementation wraps
whole blocks (nemo_dist), their sub-modules (upstream's full checkpointing)
or uses the model's own gradient checkpointing. While those sub-modules run,
an :class:`~nemo_dist.conformance.suites.ddp.ops.OpCounter` charges the ops they
execute to their block: its matmuls and other ops, in forward and backward.

This module imports ``transformers`` only inside the functions that build a
model, so the parent can import it without ``transformers`` installed.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import set_checkpoint_early_stop

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.entry_point import device_of, dtype_of, grads_of, parallelizer, seeded
from nemo_dist.conformance.suites.ddp.messages import BlockRun, OpCounts
from nemo_dist.conformance.suites.ddp.ops import OpCounter

__all__ = [
    "ARCHITECTURES",
    "ATTENTION_NAMES",
    "MLP_NAMES",
    "Architecture",
    "recompute_counts",
    "warm_up",
]

#: The block's attention sub-module: the first of these attributes it has.
ATTENTION_NAMES = ("self_attn", "attention", "attn", "linear_attn")
#: The block's MLP sub-module, when it has one (Whisper-like blocks keep fc1/fc2 on the block itself).
MLP_NAMES = ("mlp", "feed_forward", "ffn")

_VOCAB = 64
_TOKENS = (2, 6)  # batch, sequence length of the token inputs
_MEL_BINS = 4
_AUDIO_POSITIONS = 4  # the encoder takes 2 * max_source_positions frames
_VISION_GRID = (1, 2, 4)  # temporal, height, width patches of the one synthetic image
_MODEL_SEED = 20
_INPUT_SEED = 21

_TEXT: dict[str, Any] = {
    "vocab_size": _VOCAB,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
_AUDIO_ENCODER: dict[str, Any] = {
    "d_model": 16,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "num_mel_bins": _MEL_BINS,
    "max_source_positions": _AUDIO_POSITIONS,
}


def _transformers() -> Any:
    """The ``transformers`` package (imported on first use; typed loosely, it is a test target)."""
    return importlib.import_module("transformers")


# --------------------------------------------------------------------------- builders
def _qwen2_vl() -> nn.Module:
    t = _transformers()
    # head_dim 8: the multimodal rotary sections must sum to head_dim / 2.
    rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
    vision = {
        "depth": 2,
        "embed_dim": 16,
        "hidden_size": 16,
        "num_heads": 2,
        "mlp_ratio": 2,
        "in_channels": 1,
        "patch_size": 2,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = t.Qwen2VLConfig(text_config={**_TEXT, "rope_parameters": rope}, vision_config=vision)
    return t.Qwen2VLForConditionalGeneration(config)


def _qwen2_audio() -> nn.Module:
    t = _transformers()
    config = t.Qwen2AudioConfig(audio_config=_AUDIO_ENCODER, text_config={"model_type": "qwen2", **_TEXT})
    return t.Qwen2AudioForConditionalGeneration(config)


def _whisper() -> nn.Module:
    t = _transformers()
    config = t.WhisperConfig(
        vocab_size=_VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=_MEL_BINS,
        max_source_positions=_AUDIO_POSITIONS,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
    )
    return t.WhisperForConditionalGeneration(config)


# ----------------------------------------------------------------------------- inputs
def _inputs(device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The synthetic inputs every tower draws from, the same on every rank."""
    generator = torch.Generator().manual_seed(_INPUT_SEED)
    t, h, w = _VISION_GRID
    patch = 1 * 2 * 2 * 2  # in_channels * temporal_patch_size * patch_size**2
    return {
        "input_ids": torch.randint(0, _VOCAB, _TOKENS, generator=generator).to(device),
        "pixel_values": torch.randn(t * h * w, patch, generator=generator, dtype=torch.float64).to(device, dtype),
        "image_grid_thw": torch.tensor([_VISION_GRID], device=device),
        "input_features": torch.randn(
            _TOKENS[0], _MEL_BINS, 2 * _AUDIO_POSITIONS, generator=generator, dtype=torch.float64
        ).to(device, dtype),
    }


def _square_mean(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float().square().mean() if tensor.dtype == torch.bfloat16 else tensor.square().mean()


# ----------------------------------------------------------------------------- drivers
# Each takes (what the entry point returned, the model, the inputs) and returns the tower's scalar loss term.
# The language driver calls what the entry point returned, so a DDP's forward runs (and prepares its
# reducer); the vision and audio towers are called directly on the model, with inputs of the shape they
# take, and their loss uses every trainable parameter (DDP, without find_unused_parameters, needs that).
def _text_logits(wrapped: Any, model: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    return _square_mean(wrapped(input_ids=x["input_ids"], use_cache=False).logits)


def _qwen2_vl_vision(wrapped: Any, model: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model.model.visual(x["pixel_values"], grid_thw=x["image_grid_thw"])
    return _square_mean(out.pooler_output)  # the merged patches: every vision parameter takes part


def _qwen2_audio_tower(wrapped: Any, model: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    encoded = model.model.audio_tower(x["input_features"]).last_hidden_state
    return _square_mean(model.model.multi_modal_projector(encoded))


def _whisper_both(wrapped: Any, model: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    # Encoder and decoder in one forward: each block runs once. Driving the encoder again on its own would use its
    # parameters twice in one iteration, which DDP refuses under reentrant checkpointing ("marked ready twice").
    out = wrapped(input_features=x["input_features"], decoder_input_ids=x["input_ids"], use_cache=False)
    return _square_mean(out.logits)


Driver = Callable[[Any, Any, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Architecture:
    """A tiny real ``transformers`` model and the facts the checks assert against."""

    #: The ``transformers`` class built.
    class_name: str
    #: Builds the model (float32, random init; the caller seeds and casts).
    build: Callable[[], nn.Module]
    #: Layer group -> dotted path of the container of its blocks, in model order.
    groups: dict[str, str]
    #: Driver of each group's tower; the language driver goes through the wrapped model.
    drivers: dict[str, Driver]
    #: The block frozen (``requires_grad_(False)``) before wrapping, as "group.index".
    frozen: str


#: Architecture name -> its tiny model and facts (two blocks per group).
ARCHITECTURES: dict[str, Architecture] = {
    "Qwen2-VL": Architecture(
        "Qwen2VLForConditionalGeneration",
        _qwen2_vl,
        {"language": "model.language_model.layers", "vision": "model.visual.blocks"},
        {"language": _text_logits, "vision": _qwen2_vl_vision},
        "vision.1",
    ),
    "Qwen2-Audio": Architecture(
        "Qwen2AudioForConditionalGeneration",
        _qwen2_audio,
        {"language": "model.language_model.layers", "audio": "model.audio_tower.layers"},
        {"language": _text_logits, "audio": _qwen2_audio_tower},
        "audio.1",
    ),
    "Whisper": Architecture(
        "WhisperForConditionalGeneration",
        _whisper,
        {"audio": "model.encoder.layers", "language": "model.decoder.layers"},
        {"language": _whisper_both},
        "audio.1",
    ),
}


# ------------------------------------------------------------------------------ blocks
def _first_child(block: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        child = getattr(block, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


@dataclass
class _Block:
    """One block of a group, its counted sub-modules and their forward counts."""

    path: str
    module: nn.Module
    attention: nn.Module
    mlp: nn.Module | None
    calls: dict[str, int]


def _blocks(model: nn.Module, arch: Architecture) -> dict[str, _Block]:
    """Each block by name ("group.index"), found at the architecture's paths; LookupError where a path moved."""
    found: dict[str, _Block] = {}
    for group, path in arch.groups.items():
        try:
            container = model.get_submodule(path)
        except AttributeError:
            container = None
        if not isinstance(container, nn.ModuleList) or len(container) == 0:
            raise LookupError(
                f"the tiny {arch.class_name} has no block list at {path} (its {group} group) under transformers "
                f"{_transformers().__version__}; the facts in "
                "nemo_dist.conformance.suites.real_models.ranks need updating"
            )
        for index, block in enumerate(container):
            attention = _first_child(block, ATTENTION_NAMES)
            if attention is None:
                raise LookupError(f"{path}.{index} of the tiny {arch.class_name} has none of {ATTENTION_NAMES}")
            mlp = _first_child(block, MLP_NAMES)
            found[f"{group}.{index}"] = _Block(f"{path}.{index}", block, attention, mlp, {"attention": 0, "mlp": 0})
    return found


# The counted sub-modules whose forward is running, innermost last, as ("group.index", key): what
# an OpCounter charges an op to. One forward runs at a time, so a plain list serves.
_RUNNING: list[tuple[str, str]] = []


def _running() -> tuple[str, str] | None:
    """The innermost counted sub-module whose ``forward`` is running now, if any."""
    return _RUNNING[-1] if _RUNNING else None


def _count_forward(module: nn.Module, calls: dict[str, int], key: str, block: str) -> None:
    """Make ``module``'s instance ``forward`` count its calls in ``calls[key]`` (recomputes included).

    While it runs, :func:`_running` names it as ``(block, key)``.
    """
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        calls[key] += 1
        _RUNNING.append((block, key))
        try:
            return original(*args, **kwargs)
        finally:
            _RUNNING.pop()

    module.forward = forward


def _block_ops(forward: OpCounter, backward: OpCounter, block: str) -> OpCounts:
    """The matmuls and the other ops ``block``'s attention and MLP executed, each as (in forward, in backward)."""
    keys = [(block, "attention"), (block, "mlp")]

    def counted(kind: str) -> tuple[int, int]:
        return sum(getattr(forward, kind)[k] for k in keys), sum(getattr(backward, kind)[k] for k in keys)

    return OpCounts(matmuls=counted("matmuls"), others=counted("others"))


def _build(arch: Architecture) -> tuple[nn.Module, dict[str, _Block]]:
    """The seeded float64 model in training mode with its frozen block, and its blocks (a fresh copy each call)."""
    model = seeded(arch.build, _MODEL_SEED)
    model.train()
    blocks = _blocks(model, arch)
    blocks[arch.frozen].module.requires_grad_(False)
    return model, blocks


def _loss(arch: Architecture, wrapped: nn.Module, model: nn.Module) -> torch.Tensor:
    """Drive every tower of ``model`` once (the language tower through ``wrapped``); the summed loss."""
    param = next(model.parameters())
    x = _inputs(param.device, param.dtype)
    terms = [driver(wrapped, model, x) for driver in arch.drivers.values()]
    return torch.stack(terms).sum()


# ------------------------------------------------------------------------- rank checks
def warm_up(architectures: list[str]) -> dict[str, str | None]:
    """Import ``transformers`` and build each of ``architectures`` once: the template later models are copied from.

    A warm-up step: the first import costs seconds. Returns ``{"transformers":
    its version, "import_error": None}``, or the version None and the import's
    error as ``"Type: message"`` where this rank cannot import it.
    """
    try:
        version = str(_transformers().__version__)
    except ImportError as error:
        return {"transformers": None, "import_error": f"{type(error).__name__}: {error}"}
    for name in architectures:
        seeded(ARCHITECTURES[name].build, _MODEL_SEED)
    return {"transformers": version, "import_error": None}


def recompute_counts(
    impl: Implementation, architecture: str, mode: bool | str, scopes: list[str]
) -> dict[str, Any]:
    """For each scope: how often each block's attention and MLP ran during backward, their ops, the gradients.

    A fresh model per scope (seeded: the same weights on every rank and in
    every build) with the architecture's frozen block, its attention and MLP
    counted, wrapped through the implementation's entry point with
    ``activation_checkpointing=mode`` and the scope; every tower runs forward
    on the same inputs on every rank, then one backward of the summed loss.
    Beside them an unwrapped, uncheckpointed copy gives the gradients to match.

    Returns ``{"transformers": version, "dtype": the wrapped models' parameter dtype, "blocks": {"group.index": {"path",
    "trainable", "has_mlp"}}, "names": [parameter names], "plain_grads": [...],
    "scopes": {scope: {"runs": {"group.index": block run}, "grads": [...]}}}``: a
    block run (:mod:`~nemo_dist.conformance.suites.ddp.checkpoint_rules`) holds the
    forward runs of the block's attention and MLP (where it has one), in
    forward and again in backward, and (selective mode only; None otherwise)
    the matmuls and other ops computing a tensor they executed in each
    (:class:`~nemo_dist.conformance.suites.ddp.ops.OpCounter`); the forward runs with
    torch's checkpoint early stop off, so a checkpointed region recomputes to
    its end. Gradients are CPU copies in ``model.parameters()`` order (None
    where a parameter has none).
    """
    arch = ARCHITECTURES[architecture]
    plain, plain_blocks = _build(arch)
    result: dict[str, Any] = {
        "transformers": str(_transformers().__version__),
        "dtype": "torch.float64",
        "blocks": {
            name: {
                "path": block.path,
                "trainable": any(p.requires_grad for p in block.module.parameters()),
                "has_mlp": block.mlp is not None,
            }
            for name, block in plain_blocks.items()
        },
        "names": [name for name, _ in plain.named_parameters()],
        "scopes": {},
    }
    for scope in scopes:
        model, blocks = _build(arch)
        for name, block in blocks.items():
            _count_forward(block.attention, block.calls, "attention", name)
            if block.mlp is not None:
                _count_forward(block.mlp, block.calls, "mlp", name)
        config = {"activation_checkpointing": mode, "activation_checkpointing_scope": scope}
        wrapped = parallelizer(impl, config).parallelize(model)
        # Only selective's rule reads the ops; counting them through a dispatch mode slows every op of the model.
        counting = mode == "selective"
        forward, backward = OpCounter(_running), OpCounter(_running)
        with forward if counting else contextlib.nullcontext(), set_checkpoint_early_stop(False):
            loss = _loss(arch, wrapped, model)
        between = {name: dict(block.calls) for name, block in blocks.items()}
        with backward if counting else contextlib.nullcontext():
            loss.backward()
        result["scopes"][scope] = {
            "runs": {
                name: BlockRun(
                    calls={
                        label: (between[name][key], block.calls[key] - between[name][key])
                        for key, label in (("attention", "attention"), ("mlp", "MLP"))
                        if key == "attention" or block.mlp is not None
                    },
                    ops=_block_ops(forward, backward, name) if counting else None,
                )
                for name, block in blocks.items()
            },
            "grads": grads_of(model),
        }
    device, dtype = device_of(plain), dtype_of(plain)
    if scopes:
        # Where the entry point put the wrapped models, in the dtype it gave them (upstream: bfloat16 at w1 on CUDA).
        device, dtype = device_of(model), dtype_of(model)
        result["dtype"] = str(dtype)
    result["plain_grads"] = _plain_grads(arch, plain, device, dtype)
    return result


#: The uncheckpointed gradients by (architecture, device, dtype), kept per rank: the same for every mode and scope.
_PLAIN_GRADS: dict[tuple[str, str, str], list[torch.Tensor | None]] = {}


def _plain_grads(arch: Architecture, plain: nn.Module, device: torch.device, dtype: torch.dtype) -> list[Any]:
    """The gradients of ``plain`` (unwrapped, uncheckpointed) on ``device`` in ``dtype``; computed once per rank."""
    key = (arch.class_name, str(device), str(dtype))
    if key not in _PLAIN_GRADS:
        plain.to(device, dtype)
        _loss(arch, plain, plain).backward()
        _PLAIN_GRADS[key] = grads_of(plain)
    return _PLAIN_GRADS[key]
