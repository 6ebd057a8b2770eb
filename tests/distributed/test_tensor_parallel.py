"""Layer 0, no process group: the tensor-parallel plan chooser, the Llama-family plan, Hugging Face's translated.

What the plans do to numbers is proven in gloo worlds by the tp conformance
suite (``tests/conformance/test_every_check.py`` runs it against this
component, ``tests/conformance/test_gallery_tp.py`` against plans in the
wild); here only which plan is chosen, in upstream's order, and how a bad
plan or head count is refused.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from nemo_dist.conformance.suites.tp.models import TinyConfig, TinyLlamaForCausalLM
from nemo_dist.distributed import tensor_parallel as tp
from tests import targets

#: An explicit plan, importable by path (``tests.distributed.test_tensor_parallel:EXPLICIT``).
EXPLICIT = {"lm_head": ColwiseParallel()}


def explicit_plan() -> dict:
    """A zero-argument function returning a plan."""
    return {"model.embed_tokens": RowwiseParallel()}


class LlamaForCausalLM(TinyLlamaForCausalLM):
    """The suite's model under the name of a class with an optimized plan."""


class _Mesh:
    """What validate_tp_mesh reads of a mesh: its size (argument plumbing, no process group)."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def test_an_explicit_plan_wins_over_every_other() -> None:
    model = LlamaForCausalLM()
    assert tp.get_parallel_plan(model, tp_shard_plan=EXPLICIT) is EXPLICIT
    assert tp.get_parallel_plan(model, tp_shard_plan=f"{__name__}:EXPLICIT") is EXPLICIT
    assert set(tp.get_parallel_plan(model, tp_shard_plan=f"{__name__}:explicit_plan")) == {"model.embed_tokens"}


def test_a_plan_path_that_names_no_plan_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"tp_shard_plan 'os:sep' gives a str, not a dict"):
        tp.get_parallel_plan(TinyLlamaForCausalLM(), tp_shard_plan="os:sep")
    with pytest.raises(ValueError, match=r"'json:dumps' is neither a plan nor a zero-argument function"):
        tp.get_parallel_plan(TinyLlamaForCausalLM(), tp_shard_plan="json:dumps")
    with pytest.raises(ValueError, match=r"tp_shard_plan 'no_such_module:x' does not name a plan"):
        tp.get_parallel_plan(TinyLlamaForCausalLM(), tp_shard_plan="no_such_module:x")


def test_the_optimized_plan_by_class_comes_before_the_hugging_face_plan() -> None:
    model = LlamaForCausalLM()
    model._tp_plan = {"lm_head": "colwise_gather_output"}  # a Hugging Face plan it must not take
    plan = tp.get_parallel_plan(model, sequence_parallel=True)
    assert isinstance(plan["model.norm"], SequenceParallel)
    assert isinstance(plan["model.layers.*.input_layernorm"], tp.SequenceParallelGathered)
    assert plan["lm_head"].input_layouts == (Shard(1),)


def test_a_model_with_a_hugging_face_plan_and_no_optimized_one_takes_it_translated() -> None:
    model = TinyLlamaForCausalLM()
    model._tp_plan = {
        "lm_head": "colwise_gather_output", "model.layers.*.self_attn.q_norm": "replicated_with_grad_allreduce"
    }
    plan = tp.get_parallel_plan(model)
    assert set(plan) == {"lm_head", "model.layers.*.self_attn.q_norm"}
    assert plan["lm_head"].output_layouts == (Replicate(),)
    assert isinstance(plan["model.layers.*.self_attn.q_norm"], tp.ReplicatedGradientSum)


def test_an_unknown_hugging_face_style_falls_back_to_the_default_plan_and_is_named_when_translated() -> None:
    model = TinyLlamaForCausalLM()
    model._tp_plan = {"lm_head": "packed_rowwise_v9"}
    with pytest.raises(ValueError, match=r"unknown Hugging Face parallel style 'packed_rowwise_v9' \(for lm_head\)"):
        tp.translate_hf_plan(model)
    assert tp.get_parallel_plan(model).keys() == tp.llama_plan().keys()


def test_a_model_with_no_plan_at_all_gets_the_llama_style_default() -> None:
    plan = tp.get_parallel_plan(TinyLlamaForCausalLM())
    assert isinstance(plan["model.layers.*.self_attn.o_proj"], RowwiseParallel)
    assert plan["lm_head"].output_layouts == (Shard(-1),)
    assert "model.norm" not in plan  # no sequence parallelism unless asked


def test_hugging_face_plans_of_every_listed_architecture_translate() -> None:
    transformers = targets.import_target("transformers")
    for name in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM"):
        cls = getattr(transformers, name)
        config = cls.config_class(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=4, pad_token_id=0)
        with torch.device("meta"):
            model = cls(config)
        plan = tp.translate_hf_plan(model)
        assert plan, name
        assert all(key.startswith(("model.", "lm_head")) for key in plan), (name, list(plan))


@pytest.mark.parametrize(("heads", "kv_heads", "size", "message"), [
    (8, 4, 3, r"num_key_value_heads=4 cannot split over 3 tensor-parallel ranks"),
    (6, 2, 4, r"num_key_value_heads=2 cannot split over 4 tensor-parallel ranks"),
    (6, 6, 4, r"num_key_value_heads=6 cannot split over 4"),
])
def test_head_counts_that_do_not_split_are_refused_naming_the_count(
    heads: int, kv_heads: int, size: int, message: str
) -> None:
    model = TinyLlamaForCausalLM(TinyConfig(num_attention_heads=heads, num_key_value_heads=kv_heads))
    with pytest.raises(ValueError, match=message):
        tp.validate_tp_mesh(model, _Mesh(size))  # type: ignore[arg-type]


def test_head_counts_that_split_and_a_mesh_of_one_pass() -> None:
    model = TinyLlamaForCausalLM()
    tp.validate_tp_mesh(model, _Mesh(4))  # type: ignore[arg-type]
    tp.validate_tp_mesh(TinyLlamaForCausalLM(TinyConfig(num_key_value_heads=1)), _Mesh(1))  # type: ignore[arg-type]
