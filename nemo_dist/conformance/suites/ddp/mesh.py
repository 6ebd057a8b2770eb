"""The ``@mesh`` a rank fills for a ``--ddp-kwarg``: the world's DeviceMesh, built once per world (rank side).

Without ``--ddp-mesh`` it is ``init_device_mesh(device_type, (W,))`` over the
whole world, on the backend's device type (``cpu`` under gloo); with
``--ddp-mesh RxS`` a 2-D mesh ``(R, S)`` with dimension names
``("dp_replicate", "dp_shard")``, as HSDP takes it. A world of another size
than ``R*S`` cannot hold that mesh: :func:`world_mesh` raises
``NotApplicable`` there, saying so.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from nemo_dist.conformance.engine.errors import NotApplicable

__all__ = ["HSDP_DIM_NAMES", "mesh_form", "mesh_mismatch", "world_mesh"]

#: The dimension names of the 2-D mesh ``--ddp-mesh RxS`` makes: replicas, then shards within a replica.
HSDP_DIM_NAMES: tuple[str, str] = ("dp_replicate", "dp_shard")

# Built once per (default group, shape): a 2-D mesh creates process groups, collectively, on every build.
_BUILT: dict[tuple[int, tuple[int, ...], str], DeviceMesh] = {}


def mesh_mismatch(shape: tuple[int, int] | None, world_size: int) -> str:
    """Why a world of ``world_size`` ranks cannot hold the ``--ddp-mesh`` ``shape``, or "" when it can (or none)."""
    if shape is None or shape[0] * shape[1] == world_size:
        return ""
    r, s = shape
    ranks_word = "rank" if world_size == 1 else "ranks"
    return (
        f"--ddp-mesh {r}x{s} makes a mesh of {r * s} ranks; this world has {world_size} {ranks_word} "
        f"(run it with --world-sizes {r * s})"
    )


def world_mesh(shape: tuple[int, int] | None, device_type: str) -> Any:
    """This world's DeviceMesh: 1-D over every rank, or ``shape`` (R, S) named :data:`HSDP_DIM_NAMES`.

    A collective on its first call in a world: every rank must call it.
    Raises ``NotApplicable`` when the world's size is not ``R*S``.
    """
    size = dist.get_world_size()
    why = mesh_mismatch(shape, size)
    if why:
        raise NotApplicable(why)
    dims = (size,) if shape is None else tuple(shape)
    key = (id(dist.group.WORLD), dims, device_type)
    if key not in _BUILT:
        names = None if shape is None else HSDP_DIM_NAMES
        _BUILT[key] = init_device_mesh(device_type, dims, mesh_dim_names=names)
    return _BUILT[key]


def _annotation_text(parameter: inspect.Parameter | None) -> str:
    if parameter is None or parameter.annotation is inspect.Parameter.empty:
        return ""
    annotation = parameter.annotation
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "") or repr(annotation)


def mesh_form(name: str, parameter: inspect.Parameter | None) -> str:
    """What a wrapper's parameter ``name`` wants where ``@mesh`` is passed to it: "mesh", "group" or "devices".

    Its annotation says so where it names ``DeviceMesh``, ``ProcessGroup`` or
    a sequence of devices; else its name: one naming a group (``process_group``,
    ``group``, ``pg``) wants the mesh's process group, one naming devices
    (``parallel_devices``, as Lightning's strategies take) the list of the
    mesh's devices; anything else gets the DeviceMesh itself.
    """
    annotation = _annotation_text(parameter)
    if "DeviceMesh" in annotation:
        return "mesh"
    if "ProcessGroup" in annotation:
        return "group"
    lowered = name.lower()
    if "device" in annotation.lower() and any(word in annotation for word in ("list", "List", "Sequence", "tuple")):
        return "devices"
    if "mesh" in lowered:
        return "mesh"
    if "group" in lowered or lowered == "pg":
        return "group"
    if "devices" in lowered:
        return "devices"
    return "mesh"
