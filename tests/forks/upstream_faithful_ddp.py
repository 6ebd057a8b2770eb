"""Upstream-faithful DDP fork (test fixture): ``parallelize_ddp`` and ``DDPManager`` as NeMo Automodel 0.7.0 behaves.

Written from upstream 0.7.0's documented behaviour; no upstream or nemo_dist
code is copied or imported.  It must conform on the core tier.  What it keeps
from upstream, on purpose:

- ``DDPManager`` warns ``DeprecationWarning`` at construction, forwards
  attribute reads to its config, and needs an initialised process group
  (``RuntimeError`` otherwise); the device is ``cuda:(rank % device_count)``
  (made current) under NCCL with CUDA, else CPU.
- World size 1: the model comes back unwrapped (moved to the device, cast to
  bfloat16 on CUDA only, checkpointed); for full checkpointing of scope "all"
  over a lone "language" group of transformers ``GradientCheckpointingLayer``
  blocks it calls ``model.gradient_checkpointing_enable()`` instead.
- ``autocast_dtype`` is not applied; ``broadcast_buffers`` goes to DDP as is
  (torch 2.13 answers with its deprecation FutureWarning).
- Layer groups: ``parallel_layer_groups`` when the model has it, else
  structural discovery (upstream's table is attached by upstream's loader, not
  by ``parallelize_ddp``).  Full checkpointing wraps sub-modules of each
  selected block (MLP, attention unless the model shares K/V across layers,
  both norms; without upstream's SDPA-state snapshot for the recompute, which
  only context parallelism needs); selective wraps whole blocks with a
  selective-checkpoint context whose policy (TorchTitan's pattern, as
  upstream's) saves every other ``mm``/``linear`` of a region, counted
  afresh in the forward and in the recompute, and always the other
  compute-heavy ops (``addmm``, ``bmm``, attention kernels).  Either way ``use_cache`` is switched off in the
  model's configs first, unless it shares K/V across layers.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from tests.forks.upstream_faithful_config import normalize_activation_checkpointing_scope

__all__ = ["DDPManager", "parallelize_ddp"]

logger = logging.getLogger(__name__)

Groups = dict[str, list[nn.Module]]

_AUDIO_WORDS = {"audio", "audio_model", "audio_tower", "audio_encoder"}
_VISION_WORDS = {"image_encoder", "vision", "vision_model", "vision_tower", "visual", "vit_model"}

# Sub-modules of a block that full checkpointing wraps: the first present name of each tuple.
_MLP_NAMES = ("mlp", "feed_forward", "ffn")
_ATTENTION_NAMES = ("self_attn", "attention", "attn", "linear_attn")
_PRE_NORM_NAMES = ("input_layernorm", "attention_norm", "layer_norm1", "norm1")
_POST_NORM_NAMES = ("post_attention_layernorm", "ffn_norm", "layer_norm2", "norm2")
# Mixture-of-transformers siblings, wrapped whenever present.
_MOT_NAMES = ("mlp_moe_gen", "input_layernorm_moe_gen", "post_attention_layernorm_moe_gen")

def _overloads(*names: str) -> frozenset[Any]:
    """The default overloads of the aten ops named that this torch has."""
    packets = (getattr(torch.ops.aten, name, None) for name in names)
    return frozenset(packet.default for packet in packets if packet is not None and hasattr(packet, "default"))


# Under selective checkpointing: every other one of these is saved, the rest recomputed ...
_ALTERNATING = _overloads("mm", "linear")
# ... and these are always saved.
_ALWAYS_SAVED = _overloads(
    "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


# ------------------------------------------------------------------------ layer groups
def _entries(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, nn.ModuleDict):
        return list(module.values())
    if isinstance(module, nn.ModuleList):
        return list(module)
    return [module]


def _follow(model: nn.Module, path: str) -> Any:
    found: Any = model
    for name in path.split("."):
        found = getattr(found, name, None)
        if found is None:
            break
    return found


def _declared_groups(model: nn.Module, declared: Mapping[str, Iterable[str]]) -> Groups:
    """Each group from the first of its paths that gives blocks; groups with none are left out."""
    groups: Groups = {}
    for group, paths in declared.items():
        for path in paths:
            found = _follow(model, path)
            blocks = [] if found is None else _entries(found) if isinstance(found, nn.Module) else [found]
            if blocks:
                groups[group] = blocks
                break
    if not groups:
        logger.warning("no path of %s's parallel_layer_groups resolves; nothing is checkpointed", type(model).__name__)
    return groups


def _discovered_groups(model: nn.Module) -> Groups:
    """Per group (by path keywords), the ModuleList or digit-keyed ModuleDict with most entries, fewest dots."""
    best: dict[str, tuple[int, int, nn.Module]] = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleDict):
            if not all(key.isdigit() for key in module):
                continue
        elif not isinstance(module, nn.ModuleList):
            continue
        if len(module) == 0:
            continue
        words = set(path.lower().split("."))
        group = "audio" if words & _AUDIO_WORDS else "vision" if words & _VISION_WORDS else "language"
        if group not in best or (len(module), -path.count(".")) > best[group][:2]:
            best[group] = (len(module), -path.count("."), module)
    return {group: _entries(container) for group, (_, _, container) in best.items()}


def _layer_groups(model: nn.Module) -> Groups:
    declared = getattr(model, "parallel_layer_groups", None)
    groups = _declared_groups(model, declared) if declared is not None else _discovered_groups(model)
    if declared is None and not groups:
        raise ValueError(f"Unknown model type: {type(model)} and no ModuleList or ModuleDict found in model structure")
    for blocks in groups.values():
        for block in blocks:
            if not isinstance(block, nn.Module):
                raise TypeError(f"layer groups of {type(model).__name__} hold a {type(block).__name__}, not a module")
    return groups


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _select(groups: Groups, scope: Any) -> tuple[list[nn.Module], tuple[str, ...]]:
    """The trainable blocks ``scope`` names, each once, and the normalised scope."""
    scopes = normalize_activation_checkpointing_scope(scope)
    if scopes == ("all",):
        chosen = [block for blocks in groups.values() for block in blocks]
    else:
        chosen = []
        for name in scopes:
            for group in ("vision", "audio") if name == "multimodal" else (name,):
                chosen.extend(groups.get(group, []))
    unique = list({id(block): block for block in chosen}.values())
    return [block for block in unique if _trainable(block)], scopes


# ------------------------------------------------------------------------ checkpointing
def _is_selective(mode: object) -> bool:
    return isinstance(mode, str) and mode.lower().replace("-", "_") == "selective"


def _kv_sharing_then_cache_off(model: nn.Module) -> bool:
    """Whether the text config shares K/V across layers; if not, ``use_cache`` is turned off in every config."""
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    shared = getattr(text_config, "num_kv_shared_layers", 0) > 0
    if not shared and config is not None:
        sub_names = getattr(type(config), "sub_configs", None) or {"text_config": None}
        for sub in (config, *(getattr(config, name, None) for name in sub_names)):
            if sub is None or (sub is not config and not hasattr(sub, "use_cache")):
                continue
            if getattr(sub, "use_cache", None) is not False:
                with contextlib.suppress(Exception):  # a read-only config attribute stays as it is
                    sub.use_cache = False
    return shared


def _wrap_first_present(block: nn.Module, names: tuple[str, ...]) -> None:
    """Wrap the first registered child among ``names`` (nothing if it already is wrapped)."""
    for name in names:
        child = getattr(block, name, None)
        if not isinstance(child, nn.Module):
            continue
        registered = name if block._modules.get(name) is child else None
        if registered is None:
            registered = next((key for key, value in block._modules.items() if value is child), None)
        if registered is None:
            continue
        if not hasattr(child, "_checkpoint_wrapped_module"):
            setattr(block, registered, checkpoint_wrapper(child))
        return


def _checkpoint_submodules(blocks: list[nn.Module], kv_sharing: bool) -> None:
    for block in blocks:
        _wrap_first_present(block, _MLP_NAMES)
        if not kv_sharing:
            _wrap_first_present(block, _ATTENTION_NAMES)
        _wrap_first_present(block, _PRE_NORM_NAMES)
        _wrap_first_present(block, _POST_NORM_NAMES)
        for name in _MOT_NAMES:
            if hasattr(block, name):
                setattr(block, name, checkpoint_wrapper(getattr(block, name)))


def _replace(root: nn.Module, old: nn.Module, new: nn.Module) -> bool:
    """Put ``new`` where ``old`` first appears below ``root`` (depth first); False if it does not."""
    for name, child in root.named_children():
        if child is old:
            setattr(root, name, new)
            return True
        if _replace(child, old, new):
            return True
    return False


def _selective_context() -> Any:
    """A selective-checkpoint context pair for one region: every other mm/linear saved, in forward and recompute."""
    seen = {False: 0, True: 0}  # matmuls met so far, in the forward and in the recompute of this region

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in _ALTERNATING:
            seen[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if seen[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in _ALWAYS_SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _checkpoint_selectively(model: nn.Module, scope: Any) -> None:
    blocks, _ = _select(_layer_groups(model), scope)
    if not blocks:
        logger.warning("no layer to checkpoint selectively")
        return
    if _kv_sharing_then_cache_off(model):
        _checkpoint_submodules(blocks, True)
        return
    for block in blocks:
        if not _replace(model, block, checkpoint_wrapper(block, context_fn=_selective_context, preserve_rng_state=True)):
            logger.warning("could not put a selective checkpoint wrapper in place of %s", type(block).__name__)


def _hf_native_checkpointing_fits(model: nn.Module, groups: Groups, scopes: tuple[str, ...]) -> bool:
    """Full scope over only transformers GradientCheckpointingLayer language blocks, all trainable."""
    if scopes != ("all",) or set(groups) != {"language"} or not groups["language"]:
        return False
    blocks = groups["language"]
    if not all(_trainable(block) for block in blocks):
        return False
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    return (
        type(blocks[0]).__module__.startswith("transformers.")
        and isinstance(blocks[0], GradientCheckpointingLayer)
        and bool(getattr(model, "supports_gradient_checkpointing", False))
        and hasattr(model, "gradient_checkpointing_enable")
    )


# ------------------------------------------------------------------------ DDP
def _resolve_device() -> torch.device:
    """This rank's device; RuntimeError without an initialised process group."""
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised first (init_process_group)")
    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        index = dist.get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def parallelize_ddp(
    model: nn.Module,
    config: Any,
    *,
    device: torch.device | None = None,
    reapply_trainability: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Checkpoint as ``config`` says and wrap ``model`` in DDP; at world size 1 return it unwrapped."""
    if device is None:
        device = _resolve_device()
    mode = config.activation_checkpointing
    scope = config.activation_checkpointing_scope

    if dist.get_world_size() == 1:
        model = model.to(device)
        if device.type == "cuda":
            model = model.to(torch.bfloat16)
        if mode:
            if _is_selective(mode):
                _checkpoint_selectively(model, scope)
            else:
                groups = _layer_groups(model)
                blocks, scopes = _select(groups, scope)
                if _hf_native_checkpointing_fits(model, groups, scopes):
                    cast(Callable[[], None], model.gradient_checkpointing_enable)()
                else:
                    _checkpoint_submodules(blocks, _kv_sharing_then_cache_off(model))
        if reapply_trainability is not None:
            reapply_trainability(model)
        return model

    if mode:
        kv_sharing = _kv_sharing_then_cache_off(model)
        if _is_selective(mode):
            _checkpoint_selectively(model, scope)
        else:
            blocks, _ = _select(_layer_groups(model), scope)
            _checkpoint_submodules(blocks, kv_sharing)

    options: dict[str, Any] = {
        "device_ids": [device] if device.type == "cuda" else None,
        "broadcast_buffers": config.broadcast_buffers,
        "find_unused_parameters": config.find_unused_parameters,
        "static_graph": config.static_graph,
        "gradient_as_bucket_view": config.gradient_as_bucket_view,
    }
    if config.bucket_cap_mb is not None:
        options["bucket_cap_mb"] = config.bucket_cap_mb
    model = model.to(device)
    if reapply_trainability is not None:
        reapply_trainability(model)
    return DistributedDataParallel(model, **options)


class DDPManager:
    """Deprecated front of ``parallelize_ddp``: resolves the device once, reads its options from the config."""

    def __init__(self, config: Any) -> None:
        warnings.warn(
            "DDPManager is deprecated; pass the DDPConfig to parallelize_ddp instead",
            DeprecationWarning,
            stacklevel=2,
        )
        self.config = config
        self.device = _resolve_device()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def __getattr__(self, name: str) -> Any:
        if name == "config":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    def parallelize(
        self, model: nn.Module, reapply_trainability: Callable[[nn.Module], None] | None = None
    ) -> nn.Module:
        """``parallelize_ddp`` on this manager's device and config."""
        return parallelize_ddp(model, self.config, device=self.device, reapply_trainability=reapply_trainability)
