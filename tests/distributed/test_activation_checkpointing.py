"""Layer 0 (no process group): which blocks activation checkpointing wraps, and what it changes.

Checkpointing is detected by behaviour: a wrapped block's attention and MLP run
``forward`` again during backward (counted inside ``forward``, since module hooks
do not fire on recompute), unwrapped blocks do not, and gradients are unchanged.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import set_checkpoint_early_stop

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing, find_layer_groups

CALLS: Counter[str] = Counter()


class _Counted(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.proj = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALLS[self.name] += 1
        return torch.tanh(self.proj(x))


class _Block(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.attn = _Counted(f"{name}.attn")
        self.mlp = _Counted(f"{name}.mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.attn(x))


def _blocks(prefix: str, count: int = 2) -> nn.ModuleList:
    return nn.ModuleList(_Block(f"{prefix}{i}") for i in range(count))


class _CausalLM(nn.Module):
    """The Hugging Face causal-LM layout: model.model.layers."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = _blocks("l", 3)
        self.head = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.model.layers:
            x = block(x)
        return self.head(x)


class _Multimodal(nn.Module):
    """Language, vision and audio towers, with one frozen vision block."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.language_model = nn.Module()
        self.model.language_model.layers = _blocks("l")
        self.model.visual = nn.Module()
        self.model.visual.blocks = _blocks("v", 3)
        self.model.visual.blocks[2].requires_grad_(False)
        self.audio_tower = nn.Module()
        self.audio_tower.layers = _blocks("a")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in [*self.model.visual.blocks, *self.audio_tower.layers, *self.model.language_model.layers]:
            x = block(x)
        return x


class _Unconventional(nn.Module):
    """No known layout: a one-entry ModuleList, a two-entry digit-keyed ModuleDict, a three-entry named one."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.ModuleList([nn.Linear(4, 4, dtype=torch.float64)])
        self.stages = nn.ModuleDict({"0": _Block("s0"), "1": _Block("s1")})
        self.heads = nn.ModuleDict({name: nn.Linear(4, 4, dtype=torch.float64) for name in ("a", "b", "c")})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem[0](x)
        for block in self.stages.values():
            x = block(x)
        return torch.stack([head(x) for head in self.heads.values()]).sum(0)


def _recomputed_in_backward(model: nn.Module) -> set[str]:
    """Run forward then backward; return the counted modules whose forward ran during backward."""
    x = torch.randn(5, 4, dtype=torch.float64)
    CALLS.clear()
    loss = model(x).pow(2).sum()
    CALLS.clear()
    loss.backward()
    return set(CALLS)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients by parameter name, with the checkpoint wrapper's extra name level removed."""
    return {
        name.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }


def test_causal_lm_blocks_are_the_language_group() -> None:
    """model.model.layers is found as the language group."""
    model = _CausalLM()
    assert find_layer_groups(model) == {"language": list(model.model.layers)}


def test_multimodal_towers_are_found_by_name() -> None:
    """Language, vision and audio blocks are found under their conventional names."""
    model = _Multimodal()
    groups = find_layer_groups(model)
    assert groups == {
        "language": list(model.model.language_model.layers),
        "vision": list(model.model.visual.blocks),
        "audio": list(model.audio_tower.layers),
    }


def test_container_with_most_entries_is_the_fallback_group() -> None:
    """No known layout: the ModuleList or digit-keyed ModuleDict with most entries wins; named ones never count."""
    model = _Unconventional()
    assert find_layer_groups(model) == {"language": list(model.stages.values())}


VISION = {"v0.attn", "v0.mlp", "v1.attn", "v1.mlp"}
AUDIO = {"a0.attn", "a0.mlp", "a1.attn", "a1.mlp"}
LANGUAGE = {"l0.attn", "l0.mlp", "l1.attn", "l1.mlp"}


@pytest.mark.parametrize("mode", [True, "full", "selective"], ids=["true", "full", "selective"])
@pytest.mark.parametrize(
    ("scope", "recomputed"),
    [
        pytest.param(("all",), VISION | AUDIO | LANGUAGE, id="all"),
        pytest.param(("language",), LANGUAGE, id="language"),
        pytest.param(("vision",), VISION, id="vision"),
        pytest.param(("audio",), AUDIO, id="audio"),
        pytest.param(("multimodal",), VISION | AUDIO, id="multimodal"),
        pytest.param(("language", "vision"), LANGUAGE | VISION, id="language+vision"),
    ],
)
def test_exactly_selected_trainable_blocks_recompute_with_unchanged_gradients(
    mode: bool | str, scope: tuple[str, ...], recomputed: set[str]
) -> None:
    """Selected trainable blocks run forward again in backward, others and frozen ones not; grads are identical."""
    torch.manual_seed(0)
    reference = _Multimodal()
    model = copy.deepcopy(reference)
    torch.manual_seed(1)
    assert _recomputed_in_backward(reference) == set()
    apply_activation_checkpointing(model, mode, scope)
    torch.manual_seed(1)
    assert _recomputed_in_backward(model) == recomputed
    expected, got = _grads(reference), _grads(model)
    assert expected.keys() == got.keys()
    for name, grad in expected.items():
        # Recompute replays the same float64 ops: bit-identical is expected.
        assert torch.equal(got[name], grad), name


class _AddmmCount(TorchDispatchMode):
    """Counts ``aten.addmm`` executed: in backward only recompute runs it (the gradients of addmm are ``mm``s)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += func.overloadpacket is torch.ops.aten.addmm
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("mode", "recomputed"), [("full", 6), ("selective", 0)], ids=["full", "selective"])
def test_selective_checkpointing_keeps_every_matmul_output_full_recomputes_them(mode: str, recomputed: int) -> None:
    """In backward, "full" runs each of the 6 block matmuls again, "selective" none (their outputs are saved)."""
    model = _CausalLM()
    apply_activation_checkpointing(model, mode, ("all",))
    with set_checkpoint_early_stop(False):  # recompute each block to its end
        loss = model(torch.randn(5, 4, dtype=torch.float64)).pow(2).sum()
    with _AddmmCount() as counter:
        loss.backward()
    assert counter.count == recomputed


def test_checkpointing_keeps_state_dict_keys() -> None:
    """Wrapping blocks does not rename parameters in the state dict."""
    model = _CausalLM()
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, "full", ("all",))
    assert list(model.state_dict()) == keys


def test_applying_twice_wraps_each_block_once() -> None:
    """A second application finds every block already wrapped and wraps nothing."""
    model = _CausalLM()
    assert len(apply_activation_checkpointing(model, "full", ("all",))) == 3
    assert apply_activation_checkpointing(model, "full", ("all",)) == []


def test_false_mode_wraps_nothing() -> None:
    """activation_checkpointing=False leaves the model untouched."""
    model = _CausalLM()
    assert apply_activation_checkpointing(model, False, ("all",)) == []
    assert _recomputed_in_backward(model) == set()
