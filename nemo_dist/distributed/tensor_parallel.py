"""Tensor and sequence parallelism for Llama-family causal LMs, with NeMo AutoModel's plan contract.

:func:`get_parallel_plan` chooses a ``parallelize_module`` plan in upstream
0.7.0's order: an explicit plan (a dict, or ``"module:name"`` of a dict or of
a function returning one) > the optimized plan for the model's class
(:data:`OPTIMIZED_PLANS`) > the model's Hugging Face plan translated
(``config.base_model_tp_plan`` / ``_tp_plan``, style names as transformers
5 writes them) > the default Llama-style plan. :func:`parallelize_tp` applies
it over a 1-D tensor-parallel mesh, then re-ties a tied embedding and head
and sets every attention's local head counts.

The Llama-family plan (:func:`llama_plan`) shards attention by heads (q, k, v
column-wise, o row-wise), the MLP by its hidden size (gate, up column-wise,
down row-wise), the embedding by vocabulary rows, and the head by vocabulary
columns, its logits a ``Shard(-1)`` DTensor (score them under torch's
``loss_parallel()`` or take ``full_tensor()``). With sequence parallelism the
residual stream between blocks is sharded on the sequence dim: the norms run
on sequence shards (their replicated weights' gradients summed over the
group by DTensor), the row-wise outputs reduce-scatter onto the sequence,
and each block's norm all-gathers its output for attention and the MLP
(:class:`SequenceParallelGathered`).

Architectures offered by class (:data:`OPTIMIZED_PLANS`): Llama, Mistral and
Qwen2 (the same module names; Qwen2's q/k/v biases shard with their
weights). Others take their Hugging Face plan, translated; per-head norms
(Qwen3's and Gemma3's ``q_norm``/``k_norm``, "replicated_with_grad_allreduce")
become :class:`ReplicatedGradientSum`, so their gradients are whole on every
rank after backward, with no separate replica sync.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

__all__ = [
    "OPTIMIZED_PLANS",
    "ReplicatedGradientSum",
    "SequenceParallelGathered",
    "get_parallel_plan",
    "llama_plan",
    "parallelize_tp",
    "translate_hf_plan",
    "validate_tp_mesh",
]

Plan = dict[str, ParallelStyle]


class SequenceParallelGathered(SequenceParallel):
    """``SequenceParallel`` (the norm runs on sequence shards) whose output is all-gathered to ``Replicate``.

    What comes next (attention, the MLP) needs the whole sequence. With
    ``use_local_output`` the output is the local (now full) tensor, else the
    replicated DTensor.
    """

    @staticmethod
    def _prepare_output_fn(use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: DeviceMesh) -> Any:
        if not isinstance(outputs, DTensor):
            raise TypeError(f"SequenceParallelGathered: expected a DTensor output, got {type(outputs).__name__}")
        gathered = outputs.redistribute(device_mesh, [Replicate()])
        return gathered.to_local() if use_local_output else gathered


class ReplicatedGradientSum(ParallelStyle):
    """A module kept whole on every rank, applied to each rank's own heads: its gradients summed over the group.

    For a per-head norm after a column-wise projection (Qwen3's and Gemma3's
    ``q_norm``/``k_norm``, input ``[..., heads, head_dim]``): each rank's
    heads give only their part of the weight's gradient. The weights become
    ``Replicate`` DTensors and the input one rank's ``Shard`` of the heads
    (dim -2), so DTensor holds the gradient as a ``Partial`` sum and every
    reader (``full_tensor()``, an optimizer step, FSDP2 on a ``(dp, tp)``
    mesh) sees the whole of it; the output is handed on local.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            replicated = distribute_tensor(param.detach(), device_mesh, [Replicate()])
            module.register_parameter(name, nn.Parameter(replicated, requires_grad=param.requires_grad))

        def heads_sharded(mod: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
            first = inputs[0]
            if not isinstance(first, DTensor):
                first = DTensor.from_local(first, device_mesh, [Shard(first.ndim - 2)], run_check=False)
            return (first, *inputs[1:])

        def local(mod: nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
            return output.to_local() if isinstance(output, DTensor) else output

        module.register_forward_pre_hook(heads_sharded)
        module.register_forward_hook(local)
        return module


def llama_plan(sequence_parallel: bool = False, prefix: str = "model.") -> Plan:
    """The Llama-family plan over module names ``{prefix}embed_tokens``, ``{prefix}layers.*``, ``lm_head``.

    Fused projections (``qkv_proj``, ``gate_up_proj``) are sharded column-wise
    like their parts (a pattern that matches nothing is skipped by torch).
    """
    layers = f"{prefix}layers.*"
    plan: Plan = {
        f"{prefix}embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        f"{layers}.self_attn.q_proj": ColwiseParallel(),
        f"{layers}.self_attn.k_proj": ColwiseParallel(),
        f"{layers}.self_attn.v_proj": ColwiseParallel(),
        f"{layers}.self_attn.o_proj": RowwiseParallel(),
        f"{layers}.mlp.gate_proj": ColwiseParallel(),
        f"{layers}.mlp.up_proj": ColwiseParallel(),
        f"{layers}.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        plan.update(
            {
                f"{prefix}embed_tokens": RowwiseParallel(
                    input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
                ),
                f"{layers}.input_layernorm": SequenceParallelGathered(use_local_output=False),
                f"{layers}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                f"{layers}.post_attention_layernorm": SequenceParallelGathered(use_local_output=False),
                f"{layers}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                f"{prefix}norm": SequenceParallel(),
                "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
            }
        )
    return plan


def _llama(model: nn.Module, sequence_parallel: bool) -> Plan:
    return llama_plan(sequence_parallel)


#: Optimized plans by class name: ``plan(model, sequence_parallel) -> plan``.
OPTIMIZED_PLANS: dict[str, Callable[[nn.Module, bool], Plan]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,
    "Qwen2ForCausalLM": _llama,
}

#: transformers 5's style names -> the style each stands for.
_HF_STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "sequence_parallel": SequenceParallel,
    "replicated_with_grad_allreduce": ReplicatedGradientSum,
}


def translate_hf_plan(model: nn.Module) -> Plan:
    """The model's Hugging Face plan as torch styles, its keys prefixed with the base model's attribute.

    The plan is ``model._tp_plan`` when set, else ``config.base_model_tp_plan``
    (keys relative to the base model, found as ``model.base_model_prefix``).
    ``ValueError`` naming the style for one this module does not know, and
    when the model has no plan.
    """
    config = getattr(model, "config", None)
    own = getattr(model, "_tp_plan", None)
    base = getattr(config, "base_model_tp_plan", None) if config is not None else None
    if not own and not base:
        raise ValueError(f"{type(model).__name__} has no Hugging Face tensor-parallel plan")
    prefix = getattr(model, "base_model_prefix", "model")
    entries = dict(own) if own else {f"{prefix}.{key}": style for key, style in (base or {}).items()}
    plan: Plan = {}
    for key, style in entries.items():
        if style not in _HF_STYLES:
            raise ValueError(f"unknown Hugging Face parallel style {style!r} (for {key})")
        plan[key] = _HF_STYLES[style]()
    return plan


def get_parallel_plan(
    model: nn.Module, sequence_parallel: bool = False, tp_shard_plan: Plan | str | None = None
) -> Plan:
    """The plan for ``model``: ``tp_shard_plan`` > :data:`OPTIMIZED_PLANS` > its Hugging Face plan > Llama's.

    ``tp_shard_plan`` is a dict, or ``"module:name"`` naming a dict or a
    zero-argument function returning one (``ValueError`` naming it
    otherwise). Sequence parallelism changes the optimized and default plans
    only: a Hugging Face plan has none (its row-wise outputs stay replicated).
    """
    if isinstance(tp_shard_plan, dict):
        return tp_shard_plan
    if tp_shard_plan is not None:
        return _imported_plan(tp_shard_plan)
    optimized = OPTIMIZED_PLANS.get(type(model).__name__)
    if optimized is not None:
        return optimized(model, sequence_parallel)
    try:
        return translate_hf_plan(model)
    except ValueError:
        return llama_plan(sequence_parallel)


def _imported_plan(path: str) -> Plan:
    module_name, _, name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"tp_shard_plan {path!r} does not name a plan: {exc}") from None
    try:
        plan = found() if callable(found) else found
    except TypeError as exc:
        raise ValueError(
            f"tp_shard_plan {path!r} is neither a plan nor a zero-argument function returning one: {exc}"
        ) from None
    if not isinstance(plan, dict):
        raise ValueError(f"tp_shard_plan {path!r} gives a {type(plan).__name__}, not a dict of parallel styles")
    return plan


def _head_counts(model: nn.Module) -> tuple[int, int] | None:
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", config)
    heads = getattr(config, "num_attention_heads", None)
    if heads is None:
        return None
    return int(heads), int(getattr(config, "num_key_value_heads", None) or heads)


def validate_tp_mesh(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """``ValueError`` (on every rank, before anything changes) when the model's heads do not split over the mesh."""
    counts = _head_counts(model)
    size = tp_mesh.size()
    if counts is None or size == 1:
        return
    heads, kv_heads = counts
    for name, count in (("num_key_value_heads", kv_heads), ("num_attention_heads", heads)):
        if count % size:
            raise ValueError(f"{name}={count} cannot split over {size} tensor-parallel ranks (not divisible)")


def _tied_pair(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    inputs, outputs = get_in(), get_out()
    if inputs is None or outputs is None or inputs.weight is not outputs.weight:
        return None
    return inputs, outputs


def _set_local_head_counts(model: nn.Module, size: int) -> None:
    """Every attention module's ``num_heads`` / ``num_key_value_heads`` made the counts of one rank's shard."""
    for module in model.modules():
        for name in ("num_heads", "num_key_value_heads"):
            value = getattr(module, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and hasattr(module, "q_proj"):
                setattr(module, name, value // size)


def parallelize_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    *,
    sequence_parallel: bool = False,
    tp_shard_plan: Plan | str | None = None,
) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` with :func:`get_parallel_plan`'s plan; return it.

    Validates the head counts first (:func:`validate_tp_mesh`), then applies
    the plan, re-ties an embedding and head that were tied (torch's
    ``parallelize_module`` replaces each weight on its own), and, where the
    plan shards attention by heads, sets each attention module's
    ``num_heads``/``num_key_value_heads`` to one rank's share. A mesh of one
    rank applies the plan too (every DTensor then whole).
    """
    validate_tp_mesh(model, tp_mesh)
    tied = _tied_pair(model)
    plan = get_parallel_plan(model, sequence_parallel, tp_shard_plan)
    parallelize_module(model, tp_mesh, plan)
    if tied is not None:
        tied[1].weight = tied[0].weight
    if any(key.endswith(("q_proj", "qkv_proj")) and _shards_output(style) for key, style in plan.items()):
        _set_local_head_counts(model, tp_mesh.size())
    return model


def _shards_output(style: ParallelStyle) -> bool:
    """Whether a column-wise style leaves its output sharded (each rank then computes its own heads)."""
    layouts = getattr(style, "output_layouts", ())
    layouts = layouts if isinstance(layouts, tuple) else (layouts,)
    return isinstance(style, ColwiseParallel) and any(isinstance(p, Shard) for p in layouts)
