"""NeMo AutoModel 0.7.0's ``AutoPipeline`` (``components.distributed.pipelining``) on a tiny transformers Llama,
as upstream's recipe builds it: ``AutoPipeline(world_mesh=..., pp_axis_name="pp", pp_schedule=...,
pp_microbatch_size=..., pp_batch_size=..., scale_grads_in_schedule=False).build(model, loss_fn=...)``, then
``info.schedule`` and ``info.stages``; the loss summed over label tokens (``--pp-loss token_sum``). Composed with
data parallelism (``dp_mesh``) as upstream's recipe composes them: ``build(..., parallelize_fn=...)`` applying
upstream's FSDP2 to each stage over upstream's 5-D mesh.

It runs in float32 only (``--pp-compute-dtype float32``): a later stage accepts an incoming hidden state only in
float16, bfloat16 or float32, so in float64 rank 1 raises "inputs_embeds must be provided for pipeline stages
without embed_tokens". It refuses tied embeddings on every rank (``tied_llama``). ``qwen3`` is a tiny Qwen3.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._pipelines import Loss

#: The rows of a microbatch the suite feeds (docs/pp.md): AutoPipeline is told its microbatch size.
ROWS = 2


def pipeline(model: Any, pp_mesh: Any, n_microbatches: int, loss_fn: Loss, schedule: str = "1f1b",
             dp_mesh: Any = None) -> Any:
    """Upstream's AutoPipeline over the pp mesh, its schedule named (upstream spells them in lower case); with
    ``dp_mesh``, over upstream's 5-D mesh of the same layout, each stage sharded by upstream's FSDP2."""
    from nemo_automodel.components.distributed.pipelining import AutoPipeline

    world_mesh, parallelize = (pp_mesh, None) if dp_mesh is None else _fsdp2(pp_mesh.size(), dp_mesh.size())
    built = AutoPipeline(
        world_mesh=world_mesh, pp_axis_name="pp", dp_axis_names=None if dp_mesh is None else ("dp_replicate", "dp_shard"),
        pp_schedule=schedule.lower(), pp_microbatch_size=ROWS, pp_batch_size=ROWS * n_microbatches,
        device=torch.device("cpu"), scale_grads_in_schedule=False,
    ).build(model, loss_fn=loss_fn, parallelize_fn=parallelize)
    return built.info.schedule, built.info.stages


def _fsdp2(pp: int, dp: int) -> tuple[Any, Any]:
    """Upstream's world mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` (pp outermost, as the suite lays its ``pp`` and
    ``dp`` dims) with its flattened dims, and a ``parallelize_fn`` applying upstream's FSDP2 (``parallelize_model``
    with an ``FSDP2Config``) to each stage, its mixed precision pinned to float32 (upstream's default computes in
    bfloat16, which the suite's float32 tolerance would rightly reject)."""
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = init_device_mesh("cpu", (pp, 1, dp, 1, 1), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    mesh[("dp_replicate", "dp_shard")]._flatten("dp")
    mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    mesh[("dp_replicate", "dp_shard", "cp")]._flatten("dp_cp")
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    context = MeshContext.from_meshes(mesh, strategy_config=FSDP2Config(mp_policy=policy))

    def parallelize(module: Any, **_axes: Any) -> Any:
        return parallelize_model(module, context)

    return mesh, parallelize


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


def qwen3() -> Any:
    """A tiny untied Qwen3 (its attention's q and k norms included): 9 layers, 16 tokens."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=9, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, max_position_embeddings=32, tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    return transformers.Qwen3ForCausalLM(config)
