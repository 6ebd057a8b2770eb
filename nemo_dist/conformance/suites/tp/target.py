"""How the tp suite calls what it checks: the models, the mesh, the target's entry point, inputs and outputs.

What is checked is one of

- a module (``--tp``), through its ``parallelize_tp(model, tp_mesh, *,
  sequence_parallel)`` (nemo_dist's) or else upstream's
  ``fsdp2_strategy_parallelize(model, device_mesh, *, mp_policy,
  sequence_parallel)`` on the whole mesh (TP, then FSDP2 over its dp dims);
- a plan (``--tp-plan MODULE:NAME``): a function ``(model, tp_mesh) ->
  model`` (None: changed in place), or a ``parallelize_module`` plan dict.

The mesh is the fsdp2 suite's (:func:`nemo_dist.conformance.suites.fsdp2.calls.mesh`): NeMo AutoModel's
``(pp, dp_replicate, dp_shard, cp, tp)`` =
``(1, 1, dp, 1, W/dp)``, with its flattened dims. Where the entry point
shards over tp only and dp > 1, the suite shards the result with
``fully_shard`` over ``dp_shard`` itself (each layer, then the root), so
every target is checked on a 2-D mesh the same way. ``--tp-after-backward``
(``fn([model], device_mesh)``) runs after every backward, as upstream's
training recipe calls ``synchronize_tp_replica_gradients``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import import_path, resolve_callable
from nemo_dist.conformance.suites.ddp.templates import manual_seed
from nemo_dist.conformance.suites.tp.models import TinyConfig, TinyLlamaForCausalLM

__all__ = [
    "OWN_MODELS",
    "TP_APIS",
    "TWO_KV_HEADS",
    "Built",
    "after_backward",
    "archs",
    "build_model",
    "explicit_plan",
    "inputs",
    "logits",
    "model_names",
    "parallelize",
    "plan_object",
    "validate",
]

#: The module entry points the suite calls, the first one a module has.
TP_APIS: tuple[str, ...] = ("parallelize_tp", "fsdp2_strategy_parallelize")
#: The suite's own models: untied and tied.
OWN_MODELS: tuple[str, ...] = ("tiny-llama", "tiny-llama-tied")
#: The suite's untied model with 2 key-value heads (of 8 heads): what a world of 4 cannot split.
TWO_KV_HEADS = "tiny-llama-2-kv-heads"
#: Relative tolerance (to max(1, max |expected|)) by the lowest precision a model computes in: the suite's own
#: model is float64 throughout; transformers' norms compute in float32 even in a float64 model.
_TOLERANCE = {"float64": 1e-10, "float32": 2e-5}
_TINY_HF = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "max_position_embeddings": 64,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


@dataclass
class Built:
    """A seeded unsharded model, its vocabulary (labels are drawn below it) and the tolerance it is held to."""

    model: nn.Module
    vocab: int
    tolerance: float


def model_names(impl: Implementation) -> tuple[str, ...]:
    """The models a run checks: ``--tp-model`` alone when given, else the suite's own and every ``--tp-arch``."""
    if impl.suite_option("tp_model"):
        return (impl.suite_option("tp_model"),)
    return (*OWN_MODELS, *archs(impl))


def archs(impl: Implementation) -> tuple[str, ...]:
    """The transformers classes ``--tp-arch`` names (comma-separated)."""
    return tuple(name.strip() for name in (impl.suite_option("tp_arch") or "").split(",") if name.strip())


def build_model(impl: Implementation, name: str, seed: int) -> Built:
    """The model ``name`` stands for, float64, seeded with ``seed`` (the same on every rank)."""
    manual_seed(seed)
    if name == impl.suite_option("tp_model"):
        model = resolve_callable(name)()
        vocab = getattr(getattr(model, "config", None), "vocab_size", None) or _embedding_rows(model) or 2
        return Built(model.to(torch.float64), int(vocab), _TOLERANCE["float32"])
    if name in (*OWN_MODELS, TWO_KV_HEADS):
        kv_heads = 2 if name == TWO_KV_HEADS else 4
        config = TinyConfig(tie_word_embeddings=name.endswith("tied"), num_key_value_heads=kv_heads)
        model = TinyLlamaForCausalLM(config).to(torch.float64)
        return Built(model, model.config.vocab_size, _TOLERANCE["float64"])
    import transformers

    cls = getattr(transformers, name)
    config = cls.config_class(**_TINY_HF)
    config._attn_implementation = "eager"
    model = cls(config).to(torch.float64)
    return Built(model, _TINY_HF["vocab_size"], _TOLERANCE["float32"])


def _embedding_rows(model: nn.Module) -> int | None:
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    return None


def plan_object(spec: str) -> Any:
    """What ``--tp-plan MODULE:NAME`` names: a function or a plan dict; ``OptionError`` naming what is wrong."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise OptionError(f"expected MODULE:NAME, such as mypackage.tp:apply_tp; got {spec!r}")
    found: Any = import_path(module_name)
    for part in qualname.split("."):
        if not hasattr(found, part):
            raise OptionError(f"{module_name!r} has no {qualname!r} (from {spec!r})")
        found = getattr(found, part)
    if not callable(found) and not isinstance(found, dict):
        raise OptionError(f"{spec!r} is a {type(found).__name__}, not a function (model, tp_mesh) or a plan dict")
    return found


def _module_api(module: Any) -> str:
    for api in TP_APIS:
        if hasattr(module, api):
            return api
    raise OptionError(f"{{opt:tp}} module {module.__name__!r} defines none of {', '.join(TP_APIS)}")


def explicit_plan() -> dict[str, Any]:
    """The explicit plan the chooser check passes a module's entry point: the head alone, vocabulary-sharded."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}


def parallelize(
    impl: Implementation, model: nn.Module, mesh: Any, sequence_parallel: bool, dp: int, explicit: bool = False
) -> nn.Module:
    """``model`` sharded by the target over ``mesh`` (see the module docstring), FSDP2 over dp where it has none.

    ``explicit``: a module's entry point is given ``tp_shard_plan=``:func:`explicit_plan` ``()``.
    """
    plan = impl.suite_option("tp_plan")
    keywords = {"tp_shard_plan": explicit_plan()} if explicit else {}
    sharded_dp = False
    if plan is not None:
        found = plan_object(plan)
        if isinstance(found, dict):
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, mesh["tp"], found)
        else:
            model = found(model, mesh["tp"]) or model
    else:
        module = impl.module("tp")
        if _module_api(module) == "parallelize_tp":
            model = module.parallelize_tp(model, mesh["tp"], sequence_parallel=sequence_parallel, **keywords) or model
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            model = module.fsdp2_strategy_parallelize(
                model, mesh, mp_policy=MixedPrecisionPolicy(), sequence_parallel=sequence_parallel, **keywords
            )
            sharded_dp = True
    if dp > 1 and not sharded_dp:
        _fully_shard(model, mesh["dp_shard"])
    return model


def _fully_shard(model: nn.Module, dp_mesh: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for layer in module:
                fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def inputs(impl: Implementation, model: nn.Module, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """The batch: ``--tp-input``'s factory ``fn(batch, seq, generator)``, else token ids or features for the model."""
    factory = impl.suite_option("tp_input")
    if factory is not None:
        return resolve_callable(factory)(batch, seq, generator)
    first = next((m for m in model.modules() if isinstance(m, (nn.Embedding, nn.Linear))), None)
    if isinstance(first, nn.Embedding):
        return torch.randint(0, first.num_embeddings, (batch, seq), generator=generator)
    width = first.in_features if isinstance(first, nn.Linear) else 1
    return torch.randn(batch, seq, width, generator=generator, dtype=torch.float64)


def logits(output: Any) -> Any:
    """The tensor a model's output scores: its ``logits`` (a Hugging Face output), a tuple's first, or itself."""
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    return output


def after_backward(impl: Implementation, model: nn.Module, mesh: Any) -> None:
    """The declared step after backward (``--tp-after-backward``), called as ``fn([model], device_mesh)``."""
    declared = impl.suite_option("tp_after_backward")
    if declared is not None:
        resolve_callable(declared)([model], mesh)


def validate(impl: Implementation) -> None:
    """Import what the tp options name (in the parent, before any world starts); ``OptionError`` naming the option."""
    for field in ("tp_plan", "tp_model", "tp_input", "tp_after_backward"):
        spec = impl.suite_option(field)
        if spec is not None:
            try:
                plan_object(spec) if field == "tp_plan" else resolve_callable(spec)
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}}: {exc.template}") from None
    if impl.suite_option("tp_plan") is None and impl.suite_option("tp") is not None:
        _module_api(importlib.import_module(impl.suite_option("tp")))
    for name in archs(impl):
        try:
            import transformers
        except ImportError as exc:
            raise OptionError(f"{{opt:tp_arch}} needs transformers: {exc}") from None
        if not isinstance(getattr(transformers, name, None), type):
            raise OptionError(f"{{opt:tp_arch}}: transformers has no class {name!r} (such as LlamaForCausalLM)")

