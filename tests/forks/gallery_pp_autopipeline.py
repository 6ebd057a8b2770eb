"""NeMo AutoModel 0.7.0's ``AutoPipeline`` (``components.distributed.pipelining``) on a tiny transformers Llama,
as upstream's recipe builds it: ``AutoPipeline(world_mesh=..., pp_axis_name="pp", pp_schedule=...,
pp_microbatch_size=..., pp_batch_size=..., scale_grads_in_schedule=False).build(model, loss_fn=...)``, then
``info.schedule`` and ``info.stages``; the loss summed over label tokens (``--pp-loss token_sum``).

It runs in float32 only (``--pp-compute-dtype float32``): a later stage accepts an incoming hidden state only in
float16, bfloat16 or float32, so in float64 rank 1 raises "inputs_embeds must be provided for pipeline stages
without embed_tokens". It refuses tied embeddings on every rank (``tied_llama``).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._pipelines import Loss

#: The rows of a microbatch the suite feeds (docs/pp.md): AutoPipeline is told its microbatch size.
ROWS = 2


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, schedule: str = "1f1b") -> Any:
    """Upstream's AutoPipeline over the pp mesh, its schedule named (upstream spells them in lower case)."""
    from nemo_automodel.components.distributed.pipelining import AutoPipeline

    built = AutoPipeline(
        world_mesh=pp_mesh, pp_axis_name="pp", dp_axis_names=None, pp_schedule=schedule.lower(),
        pp_microbatch_size=ROWS, pp_batch_size=ROWS * n_microbatches, device=torch.device("cpu"),
        scale_grads_in_schedule=False,
    ).build(model, loss_fn=loss_fn)
    return built.info.schedule, built.info.stages


def _llama(tie: bool) -> Any:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=9, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, max_position_embeddings=32, tie_word_embeddings=tie,
    )
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config)


def llama() -> Any:
    """A tiny untied Llama: 9 layers (2, 4 and 8 stages split them unevenly), 16 tokens."""
    return _llama(False)


def tied_llama() -> Any:
    """The same Llama with its head tied to its embedding."""
    return _llama(True)
