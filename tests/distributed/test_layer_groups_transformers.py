"""Layer 0: no process group. Layer groups of real transformers architectures, as upstream chooses them.

Each architecture is built from a tiny config under ``torch.device("meta")``
(no weights, nothing downloaded).  The blocks ``find_layer_groups`` returns are
asserted as facts measured on transformers 5.24: per group, the dotted path of
the container whose entries they are, compared by identity.  When
nemo_automodel is importable, upstream's own ``_extract_model_layer_groups``
must select the same blocks: with upstream's table attached as its loader
attaches it (``parallel_layer_groups``) for the classes that table names, by
structural discovery for the others.  The "beyond upstream" cases of
``nemo_dist.distributed.activation_checkpointing`` assert their documented
difference instead.  Last, which blocks ``apply_activation_checkpointing``
wraps for each scope, frozen blocks left alone.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing, find_layer_groups
from tests import targets

transformers = targets.import_target("transformers", minversion="5.0")

Groups = dict[str, list[nn.Module]]

# ----------------------------------------------------------------------------- tiny configs
# Depths differ per tower (language 4, vision 3, audio 2) so a wrong container shows.
_TEXT: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "max_position_embeddings": 64,
}
_VIT: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "image_size": 8,
    "patch_size": 4,
}
_QWEN_VIT: dict[str, Any] = {
    "depth": 3,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "out_hidden_size": 16,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "fullatt_block_indexes": [1],
}
_AUDIO_ENCODER: dict[str, Any] = {
    "d_model": 16,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "num_mel_bins": 8,
    "max_source_positions": 16,
}
# Equal encoder and decoder depths, as in whisper-large.
_WHISPER: dict[str, Any] = {
    "vocab_size": 64,
    "d_model": 16,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "num_mel_bins": 8,
    "max_source_positions": 16,
    "max_target_positions": 16,
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "decoder_start_token_id": 0,
}
_OMNI_GROUPS = {
    "language": "model.language_model.layers",
    "vision": "model.visual.blocks",
    "audio": "model.audio_tower.layers",
}
_MOE_TEXT: dict[str, Any] = {**_TEXT, "num_experts_per_tok": 1, "layer_types": ["full_attention"] * 4}


def _llava_like(cls_name: str, config_name: str, **extra: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        config = getattr(transformers, config_name)(
            vision_config={"model_type": "clip_vision_model", **_VIT, "projection_dim": 16},
            text_config={"model_type": "llama", **_TEXT},
            **extra,
        )
        return getattr(transformers, cls_name)(config)

    return build


def _whisper(cls_name: str) -> Callable[[], nn.Module]:
    return lambda: getattr(transformers, cls_name)(transformers.WhisperConfig(**_WHISPER))


_FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "Llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TEXT)),
    "Qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_TEXT)),
    "GPT2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=4, n_head=2)
    ),
    "Qwen2-VL": lambda: transformers.Qwen2VLForConditionalGeneration(
        transformers.Qwen2VLConfig(
            text_config=_TEXT,
            vision_config={"depth": 3, "embed_dim": 16, "hidden_size": 16, "num_heads": 2, "mlp_ratio": 2,
                           "patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2},
        )
    ),
    "Qwen2.5-VL": lambda: transformers.Qwen2_5_VLForConditionalGeneration(
        transformers.Qwen2_5_VLConfig(text_config=_TEXT, vision_config=_QWEN_VIT)
    ),
    "Gemma3": lambda: transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=_TEXT, vision_config=_VIT, mm_tokens_per_image=4)
    ),
    "Llava": _llava_like("LlavaForConditionalGeneration", "LlavaConfig"),
    "LlavaNext": _llava_like("LlavaNextForConditionalGeneration", "LlavaNextConfig", image_grid_pinpoints=[[8, 8]]),
    "SmolVLM": lambda: transformers.SmolVLMForConditionalGeneration(
        transformers.SmolVLMConfig(vision_config=_VIT, text_config={"model_type": "llama", **_TEXT}, scale_factor=1)
    ),
    "Mistral3": lambda: transformers.Mistral3ForConditionalGeneration(
        transformers.Mistral3Config(
            vision_config={"model_type": "pixtral", **_VIT, "head_dim": 8},
            text_config={"model_type": "mistral", **_TEXT},
            spatial_merge_size=1,
        )
    ),
    "Llama4": lambda: transformers.Llama4ForConditionalGeneration(
        transformers.Llama4Config(
            vision_config={**_VIT, "vision_output_dim": 16, "projector_input_dim": 16, "projector_output_dim": 16,
                           "pixel_shuffle_ratio": 0.5},
            text_config={**_TEXT, "intermediate_size_mlp": 32, "num_local_experts": 2},
        )
    ),
    "Qwen2-Audio": lambda: transformers.Qwen2AudioForConditionalGeneration(
        transformers.Qwen2AudioConfig(audio_config=_AUDIO_ENCODER, text_config={"model_type": "qwen2", **_TEXT})
    ),
    "Qwen2.5-Omni-thinker": lambda: transformers.Qwen2_5OmniThinkerForConditionalGeneration(
        transformers.Qwen2_5OmniThinkerConfig(
            audio_config={**_AUDIO_ENCODER, "output_dim": 16, "n_window": 4},
            vision_config=_QWEN_VIT,
            text_config=_TEXT,
        )
    ),
    "Whisper": _whisper("WhisperForConditionalGeneration"),
    "Whisper-base-model": _whisper("WhisperModel"),
    "Whisper-audio-classifier": _whisper("WhisperForAudioClassification"),
    "Step3p7": lambda: transformers.Step3p7ForConditionalGeneration(
        transformers.Step3p7Config(
            text_config={**_MOE_TEXT, "n_routed_experts": 2, "moe_intermediate_size": 8, "share_expert_dim": 8,
                         "mlp_layer_types": ["dense"] + ["sparse"] * 3, "num_sliding_attention_heads": 2,
                         "query_pre_attn_scalar": 8},
            vision_config=_VIT,
        )
    ),
    "MiniMaxM3Sparse": lambda: transformers.MiniMaxM3SparseForConditionalGeneration(
        transformers.MiniMaxM3VLConfig(
            text_config={**_MOE_TEXT, "num_local_experts": 2, "dense_intermediate_size": 32,
                         "shared_intermediate_size": 8, "rotary_dim": 4, "mlp_layer_types": ["sparse"] * 4,
                         "index_n_heads": 1, "index_head_dim": 8, "bos_token_id": 0, "eos_token_id": 0},
            vision_config={**_VIT, "patch_size": 2},
        )
    ),
}


@dataclass(frozen=True)
class _Arch:
    """An architecture, where nemo_dist's groups are, and where upstream's differ (beyond upstream only)."""

    name: str
    groups: dict[str, str]
    in_upstream_table: bool
    upstream: dict[str, str] | None = field(default=None)


_ARCHS = [
    _Arch("Llama", {"language": "model.layers"}, False),
    _Arch("Qwen2", {"language": "model.layers"}, False),
    _Arch("GPT2", {"language": "transformer.h"}, True),
    _Arch("Qwen2-VL", {"language": "model.language_model.layers", "vision": "model.visual.blocks"}, True),
    _Arch("Qwen2.5-VL", {"language": "model.language_model.layers", "vision": "model.visual.blocks"}, True),
    _Arch("Gemma3", {"language": "model.language_model.layers", "vision": "model.vision_tower.encoder.layers"}, True),
    _Arch("Llava", {"language": "model.language_model.layers", "vision": "model.vision_tower.encoder.layers"}, True),
    _Arch(
        "LlavaNext", {"language": "model.language_model.layers", "vision": "model.vision_tower.encoder.layers"}, True
    ),
    _Arch("SmolVLM", {"language": "model.text_model.layers", "vision": "model.vision_model.encoder.layers"}, True),
    _Arch(
        "Mistral3", {"language": "model.language_model.layers", "vision": "model.vision_tower.transformer.layers"}, True
    ),
    _Arch("Llama4", {"language": "language_model.model.layers", "vision": "vision_model.model.layers"}, True),
    _Arch("Qwen2-Audio", {"language": "model.language_model.layers", "audio": "model.audio_tower.layers"}, False),
    _Arch(
        "Qwen2.5-Omni-thinker",
        _OMNI_GROUPS,
        False,
    ),
    # Beyond upstream: Whisper's encoder has no audio word in its path.
    _Arch(
        "Whisper",
        {"audio": "model.encoder.layers", "language": "model.decoder.layers"},
        False,
        upstream={"language": "model.encoder.layers"},
    ),
    _Arch(
        "Whisper-base-model",
        {"audio": "encoder.layers", "language": "decoder.layers"},
        False,
        upstream={"language": "encoder.layers"},
    ),
    _Arch("Whisper-audio-classifier", {"audio": "encoder.layers"}, False, upstream={"language": "encoder.layers"}),
    # Beyond upstream: table paths that transformers 5 moved.
    _Arch(
        "Step3p7",
        {"language": "model.language_model.layers", "vision": "model.vision_model.layers"},
        True,
        upstream={"language": "model.language_model.layers"},
    ),
    _Arch(
        "MiniMaxM3Sparse",
        {"language": "model.language_model.layers", "vision": "model.vision_tower.layers"},
        True,
        upstream={},
    ),
]
_BY_NAME = {arch.name: arch for arch in _ARCHS}


def _fresh(name: str) -> nn.Module:
    with torch.device("meta"):
        return _FACTORIES[name]()


@functools.cache
def _built(name: str) -> nn.Module:
    """One model per architecture for the read-only tests (wrapping tests build their own)."""
    return _fresh(name)


def _entries(container: nn.Module) -> list[nn.Module]:
    return list(container.values()) if isinstance(container, nn.ModuleDict) else list(container)


def _as_paths(model: nn.Module, groups: Groups) -> dict[str, Any]:
    """Each group as the path of the container whose entries, in order, are exactly its blocks.

    A group that is not one container's entries shows as the list of its blocks' names instead.
    """
    modules = dict(model.named_modules())
    names = {id(module): name for name, module in modules.items()}
    shown: dict[str, Any] = {}
    for group, blocks in groups.items():
        parent = names.get(id(blocks[0]), "?").rpartition(".")[0] if blocks else "?"
        container = modules.get(parent)
        same = container is not None and [id(b) for b in _entries(container)] == [id(b) for b in blocks]
        shown[group] = parent if same else [names.get(id(b), "<not in model>") for b in blocks]
    return shown


@pytest.fixture(scope="module")
def upstream() -> tuple[Callable[[nn.Module], Groups], dict[str, Any]]:
    """Upstream's layer-group extraction and its table by class name (skips without nemo_automodel)."""
    try:
        with warnings.catch_warnings():
            # torch's own deprecation notice, raised while upstream's model registry imports torch._inductor.
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script_method", category=DeprecationWarning)
            from nemo_automodel._transformers.model_parallelization import _LAYER_GROUPS
            from nemo_automodel.components.distributed.parallelizer import _extract_model_layer_groups
    except ImportError as error:
        reason = f"nemo_automodel is not importable ({type(error).__name__}: {error}); the upstream comparison needs it"
        targets.missing_target(reason)
    return _extract_model_layer_groups, dict(_LAYER_GROUPS)


@contextmanager
def _loaded_as_upstream(model: nn.Module, table: dict[str, Any]) -> Iterator[None]:
    """Attach upstream's table entry as its loader does (``parallel_layer_groups``), then take it off."""
    entry = table.get(type(model).__name__)
    if entry is None:
        yield
        return
    model.parallel_layer_groups = entry
    try:
        yield
    finally:
        del model.parallel_layer_groups


@pytest.mark.parametrize("arch", _ARCHS, ids=lambda arch: arch.name)
def test_groups_are_the_measured_containers(arch: _Arch) -> None:
    """find_layer_groups returns, per group, exactly the blocks of the container measured on transformers 5.24."""
    model = _built(arch.name)
    assert _as_paths(model, find_layer_groups(model)) == arch.groups


@pytest.mark.parametrize("arch", _ARCHS, ids=lambda arch: arch.name)
def test_upstream_selects_the_same_blocks_except_documented_differences(
    arch: _Arch, upstream: tuple[Callable[[nn.Module], Groups], dict[str, Any]]
) -> None:
    """Upstream (its table attached where it names the class) picks nemo_dist's blocks, or the documented others."""
    extract, table = upstream
    model = _built(arch.name)
    assert (type(model).__name__ in table) == arch.in_upstream_table
    with _loaded_as_upstream(model, table):
        upstream_groups = extract(model)
    if arch.upstream is None:
        assert _as_paths(model, upstream_groups) == arch.groups
        assert {g: [id(b) for b in blocks] for g, blocks in upstream_groups.items()} == {
            g: [id(b) for b in blocks] for g, blocks in find_layer_groups(model).items()
        }
    else:
        assert _as_paths(model, upstream_groups) == arch.upstream
        assert arch.upstream != arch.groups


def test_class_layouts_carry_upstream_table(upstream: tuple[Callable[[nn.Module], Groups], dict[str, Any]]) -> None:
    """nemo_dist's layouts by class name hold exactly upstream's table, plus only the beyond-upstream classes."""
    from nemo_dist.distributed import activation_checkpointing as ac

    _, table = upstream
    ours = {name: {g: tuple(p) for g, p in layout.items()} for name, layout in ac._UPSTREAM_LAYOUTS.items()}
    theirs = {name: {g: tuple(p) for g, p in layout.items()} for name, layout in table.items()}
    assert ours == theirs
    assert set(ac._BEYOND_UPSTREAM_LAYOUTS) == {
        "WhisperForConditionalGeneration",
        "WhisperModel",
        "WhisperForAudioClassification",
    }


def test_model_attribute_overrides_table_and_discovery() -> None:
    """A model's parallel_layer_groups is followed: first resolving path per group, no fallback when none resolves."""
    model = _fresh("Llava")
    model.parallel_layer_groups = {
        "vision": ("model.no_such_tower.layers", "model.language_model.layers"),
        "audio": ("model.vision_tower.encoder.layers.0",),
        "language": ("lm_head_missing",),
    }
    groups = find_layer_groups(model)
    assert _as_paths(model, groups) == {
        "vision": "model.language_model.layers",
        "audio": ["model.vision_tower.encoder.layers.0"],
    }
    model.parallel_layer_groups = {"language": ("nothing.here",)}
    assert find_layer_groups(model) == {}


# ----------------------------------------------------------------------------- wrapping by scope
_WRAP_CASES = {
    # architecture: (containers per group, blocks frozen as "container.index")
    "Qwen2.5-Omni-thinker": (
        _OMNI_GROUPS,
        {"model.visual.blocks.1", "model.audio_tower.layers.0"},
    ),
    "Whisper": (
        {"audio": "model.encoder.layers", "language": "model.decoder.layers"},
        {"model.decoder.layers.2"},
    ),
}
_SCOPE_GROUPS = {
    "all": {"language", "vision", "audio"},
    "language": {"language"},
    "vision": {"vision"},
    "audio": {"audio"},
    "multimodal": {"vision", "audio"},
}


def _block_names(containers: dict[str, str], model: nn.Module, groups: set[str]) -> set[str]:
    modules = dict(model.named_modules())
    return {
        f"{path}.{index}"
        for group, path in containers.items()
        if group in groups
        for index in range(len(_entries(modules[path])))
    }


@pytest.mark.parametrize("scope", list(_SCOPE_GROUPS))
@pytest.mark.parametrize("name", list(_WRAP_CASES))
def test_scope_wraps_exactly_its_trainable_blocks(name: str, scope: str) -> None:
    """Each scope wraps, in place, the trainable blocks of its groups and nothing else; frozen blocks stay bare."""
    containers, frozen = _WRAP_CASES[name]
    model = _fresh(name)
    modules = dict(model.named_modules())
    for block in frozen:
        modules[block].requires_grad_(False)
    expected = _block_names(containers, model, _SCOPE_GROUPS[scope]) - frozen
    names = {id(module): path for path, module in modules.items()}

    returned = apply_activation_checkpointing(model, "full", (scope,))

    assert {names[id(block)] for block in returned} == expected
    after = dict(model.named_modules())
    for block in _block_names(containers, model, {"language", "vision", "audio"}):
        holder = after[block]
        if block in expected:
            assert isinstance(holder, CheckpointWrapper), block
            assert holder._checkpoint_wrapped_module is modules[block], block
        else:
            assert holder is modules[block], block


def test_selective_mode_selects_the_same_blocks() -> None:
    """Selective mode wraps the same blocks as full mode (Omni thinker, scope multimodal), and each only once."""
    full, selective = _fresh("Qwen2.5-Omni-thinker"), _fresh("Qwen2.5-Omni-thinker")
    full_names = {id(m): n for n, m in full.named_modules()}
    selective_names = {id(m): n for n, m in selective.named_modules()}
    wrapped_full = [full_names[id(b)] for b in apply_activation_checkpointing(full, "full", ("multimodal",))]
    wrapped_selective = [
        selective_names[id(b)] for b in apply_activation_checkpointing(selective, "selective", ("multimodal",))
    ]
    assert wrapped_selective == wrapped_full
    assert len(wrapped_full) == 5
    assert apply_activation_checkpointing(selective, "selective", ("multimodal",)) == []
