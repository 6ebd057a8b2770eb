"""How an fsdp2 check calls the component: the mesh it passes, the entry point, the config's policies.

The rank functions (:mod:`.ranks`) shard through :func:`parallelize` over
the mesh :func:`mesh` builds, as NeMo AutoModel builds it, and read the
component's ``get_sync_ctx`` through :func:`sync_ctx`. Upstream's sharding
patches ``FSDPParam.to_accumulated_grad_if_needed`` process-wide the first
time it runs; worlds are persistent and serve other implementations after
it, so every rank function runs inside :func:`own_fsdp_internals`, which
puts it back.

Config fields travel as plain data: ``mp_policy`` None (the component's
default) or a dict of ``MixedPrecisionPolicy`` fields with dtype names
(``{"param_dtype": "bfloat16"}``; ``{}`` is mixed precision off);
``offload_policy`` None or ``"cpu"`` (``CPUOffloadPolicy(pin_memory=False)``:
pinning needs an accelerator).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable

__all__ = ["MESH_DIM_NAMES", "device", "mesh", "own_fsdp_internals", "parallelize", "sync_ctx"]

#: The dims of NeMo AutoModel's FSDP2 mesh, outermost first, and its flattened dims.
MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
_FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MESHES: dict[tuple[int, int, int], Any] = {}


def device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def mesh(replicas: int, tp: int = 1) -> Any:
    """This world's mesh as upstream builds it: ``(pp, dp_replicate, dp_shard, cp, tp)`` = ``(1, R, W/(R*tp), 1, tp)``.

    With the flattened dims ``dp``, ``dp_shard_cp`` and ``dp_cp``; on "cpu"
    under gloo. Built once per world, replica count and tensor-parallel size
    (a collective, in the same order on every rank).
    """
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.group.WORLD), replicas, tp)
    if key not in _MESHES:
        shape = (1, replicas, dist.get_world_size() // (replicas * tp), 1, tp)
        built = init_device_mesh(device().type, shape, mesh_dim_names=MESH_DIM_NAMES)
        for name, dims in _FLATTENED.items():
            built[dims]._flatten(name)
        _MESHES[key] = built
    return _MESHES[key]


@contextlib.contextmanager
def own_fsdp_internals() -> Iterator[None]:
    """Put back what an implementation patched on torch's ``FSDPParam`` (upstream does, process-wide)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    original = FSDPParam.to_accumulated_grad_if_needed
    try:
        yield
    finally:
        FSDPParam.to_accumulated_grad_if_needed = original  # type: ignore[method-assign]


def _policies(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with ``mp_policy`` and ``offload_policy`` made torch's policy objects."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    made = dict(fields)
    if made.get("mp_policy") is not None:
        made["mp_policy"] = MixedPrecisionPolicy(**{k: _DTYPES.get(v, v) for k, v in made["mp_policy"].items()})
    if made.get("offload_policy") == "cpu":
        made["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    return made


def parallelize(impl: Implementation, model: nn.Module, device_mesh: Any, fields: dict[str, Any]) -> nn.Module:
    """Shard ``model`` through the fsdp2 module with ``FSDP2Config(**fields)``; return what it returns.

    ``FSDP2Manager(config, device_mesh).parallelize(model)`` when the module
    has one (upstream's deprecation warning silenced), else
    ``fsdp2_strategy_parallelize(model, device_mesh, **keywords)`` with the
    config's fields as keywords (the config built first, so its defaults
    apply, not the function's).
    """
    module = impl.module("fsdp2")
    config = module.FSDP2Config(**_policies(fields))
    if hasattr(module, "FSDP2Manager"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            manager = module.FSDP2Manager(config, device_mesh)
        result = manager.parallelize(model)
    else:
        keywords = {
            name: getattr(config, name)
            for name in (
                "mp_policy",
                "offload_policy",
                "activation_checkpointing",
                "enable_fsdp2_prefetch",
                "fsdp2_backward_prefetch_depth",
                "fsdp2_forward_prefetch_depth",
                "reshard_after_forward",
                "activation_checkpointing_scope",
            )
        }
        result = module.fsdp2_strategy_parallelize(model, device_mesh, **keywords)
    return model if result is None else result


def sync_ctx(impl: Implementation) -> Callable[..., Any]:
    """The component's ``get_sync_ctx``: the fsdp2 module's, else ``--fsdp2-sync-ctx``'s; ``NotSupported`` if none."""
    found = getattr(impl.module("fsdp2"), "get_sync_ctx", None)
    if found is None and impl.fsdp2_sync_ctx is not None:
        found = resolve_callable(impl.fsdp2_sync_ctx)
    if found is None:
        raise NotSupported(f"{impl.fsdp2} defines no get_sync_ctx (name one with --fsdp2-sync-ctx MODULE:NAME)")
    return found
