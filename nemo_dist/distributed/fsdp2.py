"""FSDP2 data parallelism: shard a model over a device mesh with torch's ``fully_shard``, as NeMo AutoModel does.

Entry points kept from upstream 0.7.0, both over one implementation:

- ``FSDP2Manager(config, device_mesh).parallelize(model)``: upstream's
  config-driven class (``components/distributed/fsdp2.py``), the shape of
  ``DDPManager`` next to it. Upstream 0.7 deprecates it for its
  ``MeshContext``/``ModelParallelizer`` machinery (removal planned in 0.8);
  that machinery exists for tensor, pipeline and expert parallelism, which
  this component does not have, so the class stays and is not deprecated.
- ``fsdp2_strategy_parallelize(model, device_mesh, **flags)``: upstream's
  functional entry point (``components/distributed/parallelizer.py``), the one
  scripts and upstream's own tests call directly; same keyword names, order
  and defaults, so existing calls keep working, and its tensor-parallel
  keywords are accepted at their defaults only.

Upstream's third way in, ``parallelize_model(model, MeshContext)``, is not
kept: a ``MeshContext`` carries tensor, pipeline and expert parallel meshes
and a model-owned parallelizer hook, none of which this component has.

The config bundles the policy, the mesh the topology
(``nemo_dist.distributed.mesh``). What ``parallelize`` does, in upstream's
order:

0. Where the mesh's ``tp`` dim is larger than 1: tensor parallelism over
   it first, as upstream applies it before FSDP2
   (:func:`nemo_dist.distributed.tensor_parallel.parallelize_tp`, with the
   config's ``sequence_parallel`` and ``tp_plan``); FSDP2 then shards the
   DTensors over the data-parallel dims, 2-D.
1. World size 1 or a one-element mesh (:func:`fsdp2_sharding_enabled` False):
   activation checkpointing when enabled, and nothing else. Nothing is
   sharded and nothing is cast, so ``mp_policy`` does not apply: such a
   world computes in the model's own dtype (upstream's behaviour).
2. Activation checkpointing of the selected layer groups (the DDP
   component's code), then ``reapply_trainability(model)`` when given.
3. Every ``ModuleList`` (and ``ModuleDict``) reached from the root, not
   looking inside a layer already sharded, has each entry made an FSDP unit.
   With ``reshard_after_forward=None`` every entry but the last reshards
   after forward; with prefetch on (and resharding not off), each entry
   prefetches the next ``fsdp2_forward_prefetch_depth`` entries in forward
   and the previous ``fsdp2_backward_prefetch_depth`` in backward. A fully
   frozen child named as a multimodal tower or projector (``visual``,
   ``vision_tower``, ``mm_projector``, ...) is not descended into: its
   layers stay in the root unit (upstream's default frozen policy "root").
4. An untied, trainable input embedding and output embedding (as
   ``get_input_embeddings()``/``get_output_embeddings()`` name them) become
   units of their own: the input one resharding after forward unless
   ``reshard_after_forward`` is False, the output one never.
5. The root module becomes the last unit and never reshards after forward.

``fully_shard`` broadcasts nothing: every rank must start from the same
weights (seed the model identically, or load the same checkpoint), as
upstream requires. Gradients are averaged over every data-parallel rank
(HSDP: over replicas x shards).

Upstream's steps left out: async tensor parallelism, pipeline and expert
parallelism, per-layer compile, the transformers-specific paths (re-tying an
LM head from a Hugging Face config, Hugging Face's own gradient
checkpointing, key-value sharing detection) and upstream's process-global
patches of torch's FSDP internals. Beyond upstream: a model with no
``ModuleList``/``ModuleDict`` is sharded as one root unit, where upstream's
layer discovery raises ``ValueError``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import fields
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing
from nemo_dist.distributed.fsdp2_config import FSDP2Config, default_mp_policy
from nemo_dist.distributed.mesh import get_fsdp_dp_mesh

__all__ = ["FSDP2Manager", "fsdp2_sharding_enabled", "fsdp2_strategy_parallelize", "get_sync_ctx"]

logger = logging.getLogger(__name__)

#: Child names upstream treats as multimodal towers and projectors (``multimodal_fsdp.py``).
_MULTIMODAL_NAMES = frozenset((
    "visual", "vision", "vision_tower", "vision_model", "vit_model", "image_encoder", "vision_encoder",
    "audio_tower", "audio_encoder", "audio_model",
    "embed_vision", "embed_audio", "mm_projector", "aligner", "multi_modal_projector", "multimodal_projector",
    "vision_projector", "vit_large_projector", "audio_projector",
))

_Reapply = Callable[[nn.Module], None]


def fsdp2_sharding_enabled(device_mesh: DeviceMesh) -> bool:
    """Whether parallelizing over ``device_mesh`` shards the model: False at world size 1 or on a one-element mesh.

    The world size is the default process group's, or the ``WORLD_SIZE``
    environment variable (default 1) without one, as upstream reads it. When
    False, nothing is sharded and no ``MixedPrecisionPolicy`` casts anything.
    """
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return world_size != 1 and device_mesh.size() != 1


def _is_frozen_multimodal(name: str, module: nn.Module) -> bool:
    params = list(module.parameters())
    return name in _MULTIMODAL_NAMES and bool(params) and not any(p.requires_grad for p in params)


class _Sharder:
    """One parallelize call's ``fully_shard`` settings, applied unit by unit."""

    def __init__(self, mesh: DeviceMesh, config: FSDP2Config) -> None:
        self.mesh = mesh
        self.config = config
        self.offload_policy = config.offload_policy if config.offload_policy is not None else OffloadPolicy()
        self.mp_policy = config.mp_policy if config.mp_policy is not None else default_mp_policy()

    def shard(self, module: nn.Module, reshard_after_forward: bool) -> None:
        fully_shard(
            module,
            mesh=self.mesh,
            mp_policy=self.mp_policy,
            offload_policy=self.offload_policy,
            reshard_after_forward=reshard_after_forward,
        )

    def layers(self, module: nn.Module) -> None:
        """Make each layer of every layer list under ``module`` an FSDP unit (step 3 of the module docstring)."""
        if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            for name, child in module.named_children():
                if _is_frozen_multimodal(name, child):
                    logger.info("nemo_dist FSDP2: frozen multimodal module %s stays in the root unit", name)
                    continue
                self.layers(child)
            return
        # Upstream's rule: a ModuleDict's ModuleList and ModuleDict entries are
        # lists of their own; in a ModuleList only ModuleList entries are.
        nested_kinds: tuple[type[nn.Module], ...] = (
            (nn.ModuleList, nn.ModuleDict) if isinstance(module, nn.ModuleDict) else (nn.ModuleList,)
        )
        entries = list(module.values()) if isinstance(module, nn.ModuleDict) else list(module)
        for entry in entries:
            if isinstance(entry, nested_kinds):
                self.layers(entry)
        units = [entry for entry in entries if not isinstance(entry, nested_kinds)]
        flag = self.config.reshard_after_forward
        for index, unit in enumerate(units):
            self.shard(unit, flag if flag is not None else index < len(units) - 1)
        if self.config.enable_fsdp2_prefetch and flag is not False:
            self._prefetch(units)

    def _prefetch(self, units: list[Any]) -> None:
        forward_depth = self.config.fsdp2_forward_prefetch_depth
        backward_depth = self.config.fsdp2_backward_prefetch_depth
        for index, unit in enumerate(units):
            following = units[index + 1 : index + 1 + forward_depth]
            if following:
                unit.set_modules_to_forward_prefetch(following)
            preceding = [units[index - d] for d in range(1, backward_depth + 1) if index - d >= 0]
            if preceding:
                unit.set_modules_to_backward_prefetch(preceding)

    def embeddings(self, model: nn.Module) -> None:
        """Untied trainable input and output embeddings as units of their own (step 4)."""
        inputs, outputs = _embedding(model, "get_input_embeddings"), _embedding(model, "get_output_embeddings")
        if inputs is not None and (inputs is outputs or _tied(inputs, outputs)):
            return
        flag = self.config.reshard_after_forward
        for module, reshard in ((inputs, True if flag is None else flag), (outputs, False)):
            if module is None or isinstance(module, FSDPModule):
                continue
            if any(p.requires_grad for p in module.parameters()):
                self.shard(module, reshard)


def _embedding(model: nn.Module, getter: str) -> nn.Module | None:
    get = getattr(model, getter, None)
    if not callable(get):
        return None
    try:
        module = get()
    except (AttributeError, NotImplementedError):
        return None
    return module if isinstance(module, nn.Module) else None


def _tied(inputs: nn.Module, outputs: nn.Module | None) -> bool:
    weight = getattr(inputs, "weight", None)
    return outputs is not None and weight is not None and weight is getattr(outputs, "weight", None)


def _reject_tied_embeddings_in_lists(model: nn.Module) -> None:
    """Upstream's check: two tied embedding modules inside a layer list would become two units owning one weight."""
    inputs, outputs = _embedding(model, "get_input_embeddings"), _embedding(model, "get_output_embeddings")
    if inputs is None or inputs is outputs or not _tied(inputs, outputs):
        return
    for module in model.modules():
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and any(
            child is inputs or child is outputs for child in module.modules()
        ):
            raise ValueError(
                "Distinct tied input/output embedding modules inside a ModuleList or ModuleDict are not supported "
                "by recursive FSDP sharding; keep both outside these containers, or share one embedding module"
            )


def _parallelize(
    model: nn.Module, config: FSDP2Config, device_mesh: DeviceMesh, reapply_trainability: _Reapply | None
) -> nn.Module:
    """The one implementation behind both entry points (the module docstring's steps)."""
    mesh = get_fsdp_dp_mesh(device_mesh)
    names = device_mesh.mesh_dim_names or ()
    if "tp" in names and device_mesh["tp"].size() > 1:
        from nemo_dist.distributed.tensor_parallel import parallelize_tp

        parallelize_tp(
            model, device_mesh["tp"], sequence_parallel=config.sequence_parallel, tp_shard_plan=config.tp_plan
        )
    if config.activation_checkpointing:
        apply_activation_checkpointing(model, config.activation_checkpointing, config.activation_checkpointing_scope)
    if reapply_trainability is not None:
        reapply_trainability(model)
    if not fsdp2_sharding_enabled(device_mesh):
        return model
    _reject_tied_embeddings_in_lists(model)
    sharder = _Sharder(mesh, config)
    sharder.layers(model)
    sharder.embeddings(model)
    # The root's parameters are used again at once in backward: never resharded after forward.
    sharder.shard(model, False)
    return model


class FSDP2Manager:
    """Shard models with FSDP2 over ``device_mesh`` as ``config`` says (upstream's class, not deprecated here).

    ``config`` is an :class:`~nemo_dist.distributed.fsdp2_config.FSDP2Config`
    (``TypeError`` otherwise); ``device_mesh`` a ``DeviceMesh``, as
    :func:`~nemo_dist.distributed.mesh.create_fsdp2_device_mesh` builds it
    or any mesh :func:`~nemo_dist.distributed.mesh.get_fsdp_dp_mesh` accepts.
    The config's fields are mirrored as attributes of the same names.
    ``moe_mesh``/``moe_config`` (upstream's expert parallelism) must be None:
    ``NotImplementedError`` otherwise.
    """

    def __init__(
        self, config: FSDP2Config, device_mesh: DeviceMesh, moe_mesh: Any = None, moe_config: Any = None
    ) -> None:
        if not isinstance(config, FSDP2Config):
            raise TypeError(f"FSDP2Manager: config must be an FSDP2Config, got {type(config).__name__}")
        if not isinstance(device_mesh, DeviceMesh):
            raise TypeError(f"FSDP2Manager: device_mesh must be a DeviceMesh, got {type(device_mesh).__name__}")
        if moe_mesh is not None or moe_config is not None:
            raise NotImplementedError(
                "FSDP2Manager: moe_mesh/moe_config: expert parallelism is not supported by nemo_dist's FSDP2 component"
            )
        self.config = config
        self.device_mesh = device_mesh
        for item in fields(config):
            setattr(self, item.name, getattr(config, item.name))

    def parallelize(self, model: nn.Module, reapply_trainability: _Reapply | None = None) -> nn.Module:
        """Shard ``model`` in place as the module docstring's steps say; return it (the root, now an FSDP unit).

        At world size 1 or on a one-element mesh only activation checkpointing
        applies and the model comes back unsharded and uncast.
        ``reapply_trainability(model)``, when given, runs after checkpointing
        and before sharding. A mesh with a context, pipeline or expert dim of
        size > 1 raises ``NotImplementedError`` on every rank before anything
        is changed; a tensor-parallel dim is step 0 of the module docstring.
        """
        return _parallelize(model, self.config, self.device_mesh, reapply_trainability)


def fsdp2_strategy_parallelize(
    model: nn.Module,
    device_mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: OffloadPolicy | None = None,
    sequence_parallel: bool = False,
    activation_checkpointing: bool | str = False,
    tp_shard_plan: dict | str | None = None,
    dp_replicate_mesh_name: str = "dp_replicate",
    dp_shard_cp_mesh_name: str = "dp_shard_cp",
    tp_mesh_name: str = "tp",
    enable_async_tensor_parallel: bool = False,
    enable_compile: bool = False,
    enable_fsdp2_prefetch: bool = True,
    fsdp2_backward_prefetch_depth: int = 2,
    fsdp2_forward_prefetch_depth: int = 1,
    reshard_after_forward: bool | None = None,
    activation_checkpointing_scope: str | list[str] | tuple[str, ...] = "all",
    frozen_multimodal_sharding: str = "root",
    reapply_trainability: _Reapply | None = None,
) -> nn.Module:
    """Shard ``model`` over ``device_mesh``: upstream's functional entry point, with its keywords and defaults.

    Builds an :class:`FSDP2Config` from the keywords (so bad values raise
    as the config raises, naming the field; ``mp_policy=None`` is the bf16
    default) and shards as :meth:`FSDP2Manager.parallelize`. Note that
    ``enable_fsdp2_prefetch`` defaults to True here and False in
    ``FSDP2Config``, as upstream has it. ``sequence_parallel`` and
    ``tp_shard_plan`` apply where the mesh's ``tp`` dim is larger than 1
    (``enable_async_tensor_parallel`` and ``enable_compile`` only at their
    defaults: ``NotImplementedError``), custom mesh dim names raise
    ``ValueError`` as upstream's do, and
    ``frozen_multimodal_sharding`` other than "root" raises
    ``NotImplementedError``.
    """
    config = _strategy_config(
        mp_policy=mp_policy,
        offload_policy=offload_policy,
        sequence_parallel=sequence_parallel,
        activation_checkpointing=activation_checkpointing,
        tp_shard_plan=tp_shard_plan,
        dp_replicate_mesh_name=dp_replicate_mesh_name,
        dp_shard_cp_mesh_name=dp_shard_cp_mesh_name,
        tp_mesh_name=tp_mesh_name,
        enable_async_tensor_parallel=enable_async_tensor_parallel,
        enable_compile=enable_compile,
        enable_fsdp2_prefetch=enable_fsdp2_prefetch,
        fsdp2_backward_prefetch_depth=fsdp2_backward_prefetch_depth,
        fsdp2_forward_prefetch_depth=fsdp2_forward_prefetch_depth,
        reshard_after_forward=reshard_after_forward,
        activation_checkpointing_scope=activation_checkpointing_scope,
        frozen_multimodal_sharding=frozen_multimodal_sharding,
    )
    return _parallelize(model, config, device_mesh, reapply_trainability)


def _strategy_config(
    *,
    tp_shard_plan: dict | str | None,
    dp_replicate_mesh_name: str,
    dp_shard_cp_mesh_name: str,
    tp_mesh_name: str,
    frozen_multimodal_sharding: str,
    **fields: Any,
) -> FSDP2Config:
    """The config :func:`fsdp2_strategy_parallelize`'s keywords (all but the model, mesh and callback) stand for.

    Custom mesh dim names raise ``ValueError`` and a ``frozen_multimodal_sharding``
    other than "root" ``NotImplementedError``; ``tp_shard_plan`` is the
    config's ``tp_plan``, the other keywords its fields of the same names.
    """
    if (dp_replicate_mesh_name, dp_shard_cp_mesh_name, tp_mesh_name) != ("dp_replicate", "dp_shard_cp", "tp"):
        raise ValueError(
            "fsdp2_strategy_parallelize: custom mesh dim names are not supported; the mesh uses "
            "dp_replicate, dp_shard_cp and tp (see nemo_dist.distributed.mesh)"
        )
    if frozen_multimodal_sharding != "root":
        raise NotImplementedError(
            f"fsdp2_strategy_parallelize: frozen_multimodal_sharding={frozen_multimodal_sharding!r} is not "
            "supported; nemo_dist's FSDP2 component keeps frozen multimodal towers in the root unit ('root')"
        )
    return FSDP2Config(tp_plan=tp_shard_plan, **fields)


def get_sync_ctx(
    model: nn.Module, is_optim_step: bool, defer_fsdp_grad_sync: bool = True
) -> AbstractContextManager[Any]:
    """The context to run one micro-batch's backward in; upstream's ``get_sync_ctx``, same semantics.

    - An FSDP2 root (``FSDPModule``): gradient reduction is switched on or off
      at once, for the root and every unit under it, by
      ``set_requires_gradient_sync``: on when ``is_optim_step`` (the last
      micro-batch before the optimizer step) or when ``defer_fsdp_grad_sync``
      is False, off otherwise. Unreduced gradients accumulate unsharded and
      are reduced with the last micro-batch's. The setting stays after the
      returned context (a ``nullcontext``) exits, until the next call.
    - A ``DistributedDataParallel``: its ``no_sync()`` when not
      ``is_optim_step`` (``defer_fsdp_grad_sync`` does not apply), else a
      ``nullcontext``.
    - Anything else (an unsharded model at world size 1): a ``nullcontext``.
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(is_optim_step or not defer_fsdp_grad_sync)
    elif isinstance(model, DistributedDataParallel) and not is_optim_step:
        return model.no_sync()
    return nullcontext()
