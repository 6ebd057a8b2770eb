"""The FSDP2 device mesh: ``ParallelismSizes``, the mesh built from them, its data-parallel views.

As NeMo AutoModel 0.7.0 builds it (``components/distributed/mesh_utils.py``):
a 5-D mesh with dims ``(pp, dp_replicate, dp_shard, cp, tp)`` and the
flattened dims ``dp`` (dp_replicate x dp_shard), ``dp_shard_cp`` (dp_shard x
cp) and ``dp_cp`` (all three), on device type "cpu" under gloo ("cuda" under
NCCL with CUDA). A world of one rank gets the same mesh, every dim of size 1;
the parallelizer then shards nothing (see ``fsdp2_sharding_enabled``).

Data and tensor parallelism are supported (``tp_size`` ranks per
tensor-parallel group, the innermost dim, as upstream lays it out): context,
pipeline and expert parallel sizes other than 1 raise ``NotImplementedError``. FSDP is
``dp_replicate_size`` 1 (or unset); HSDP is ``dp_replicate_size`` R > 1 with
``dp_size`` a multiple of R and larger than R (upstream's rule, so HSDP needs
at least 4 ranks: pure replication is DDP, ``parallelize_ddp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from nemo_dist.distributed._process_group import require_default_group

__all__ = [
    "FLATTENED_DIMS",
    "MESH_DIM_NAMES",
    "ParallelismSizes",
    "create_fsdp2_device_mesh",
    "get_flat_mesh",
    "get_fsdp_dp_mesh",
]

#: The dims of the mesh :func:`create_fsdp2_device_mesh` builds, outermost first.
MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: Flattened dims of that mesh: name -> the dims it spans.
FLATTENED_DIMS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
#: Dims whose size must be 1 here: name -> the parallelism it would be.
_UNSUPPORTED_DIMS = {"cp": "context", "pp": "pipeline", "ep": "expert"}
_KNOWN_DIMS = frozenset((*MESH_DIM_NAMES, *FLATTENED_DIMS, "ep", "ep_shard"))
#: A 1-D mesh with one of these names is sharded over as it is.
_DATA_PARALLEL_DIMS = frozenset(("dp_shard", "dp", "dp_shard_cp", "dp_cp"))


def _not_supported(field: str, value: int, kind: str) -> NotImplementedError:
    return NotImplementedError(
        f"{field}={value}: {kind} parallelism is not supported by nemo_dist's FSDP2 component "
        "(data parallelism only: FSDP and HSDP)"
    )


@dataclass(frozen=True, kw_only=True)
class ParallelismSizes:
    """Requested parallel sizes for FSDP (``dp_replicate_size`` unset or 1) and HSDP.

    Checked at construction: sizes are ints >= 1 (``TypeError``/``ValueError``
    naming the field), ``pp_size``, ``cp_size`` and ``ep_size``
    other than 1 raise ``NotImplementedError``, and with ``dp_size`` given,
    ``dp_replicate_size`` must divide it and (unless 1) be smaller than it.
    ``dp_size=None`` means the world size over ``tp_size``, checked by :meth:`mesh_shape`.
    """

    #: Data-parallel ranks (replicas x shards); ``None``: the whole world over ``tp_size``.
    dp_size: int | None = None
    #: HSDP replicas; ``None`` or 1: plain FSDP.
    dp_replicate_size: int | None = None
    tp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    ep_size: int = 1

    def __post_init__(self) -> None:
        for name in ("dp_size", "dp_replicate_size", "tp_size", "pp_size", "cp_size", "ep_size"):
            value = getattr(self, name)
            if value is None and name.startswith("dp"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ParallelismSizes.{name} must be an int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"ParallelismSizes.{name} must be >= 1, got {value}")
        for name in ("cp_size", "pp_size", "ep_size"):
            value = getattr(self, name)
            if value != 1:
                raise _not_supported(f"ParallelismSizes.{name}", value, _UNSUPPORTED_DIMS[name[:2]])
        if self.dp_size is not None:
            self._split(self.dp_size)

    def _split(self, dp_size: int) -> tuple[int, int]:
        """(replicas, shards) of ``dp_size`` data-parallel ranks; ``ValueError`` as upstream rejects them."""
        replicas = self.dp_replicate_size or 1
        if dp_size % replicas:
            raise ValueError(
                f"ParallelismSizes.dp_replicate_size={replicas} must divide dp_size={dp_size} "
                "(dp_size must be a multiple of dp_replicate_size)"
            )
        if replicas != 1 and replicas >= dp_size:
            raise ValueError(
                f"ParallelismSizes.dp_replicate_size={replicas} must be less than dp_size={dp_size}: "
                "FSDP2 does not support pure replication (the DDP use case; use parallelize_ddp)"
            )
        return replicas, dp_size // replicas

    def mesh_shape(self, world_size: int) -> tuple[int, int, int, int, int]:
        """The mesh shape ``(pp, dp_replicate, dp_shard, cp, tp)`` for a world of ``world_size`` ranks.

        ``ValueError`` naming ``dp_size`` when the sizes do not multiply to
        ``world_size``, or naming ``dp_replicate_size`` when it does not
        divide the data-parallel size or is not smaller than it.
        """
        if world_size % self.tp_size:
            raise ValueError(
                f"ParallelismSizes.tp_size={self.tp_size} does not divide a world of {world_size} ranks"
            )
        dp_size = world_size // self.tp_size if self.dp_size is None else self.dp_size
        if dp_size * self.tp_size != world_size:
            raise ValueError(
                f"ParallelismSizes.dp_size={dp_size} does not fit a world of {world_size} ranks: "
                f"dp_size * tp_size * cp_size * pp_size = {dp_size * self.tp_size} must equal the world size"
            )
        replicas, shards = self._split(dp_size)
        return (1, replicas, shards, 1, self.tp_size)


def _mesh_device_type() -> str:
    """The mesh's device type: "cuda" under NCCL with CUDA, else "cpu"; ``RuntimeError`` without a process group."""
    require_default_group("nemo_dist FSDP2")
    return "cuda" if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available() else "cpu"


def create_fsdp2_device_mesh(sizes: ParallelismSizes | None = None) -> DeviceMesh:
    """Build the world's FSDP2 mesh: dims :data:`MESH_DIM_NAMES`, flattened :data:`FLATTENED_DIMS`.

    A collective: every rank of the default process group calls it, with the
    same ``sizes`` (default: FSDP over the whole world). Sizes that do not fit
    the world raise ``ValueError`` on every rank before any communication
    (see :meth:`ParallelismSizes.mesh_shape`); without an initialised default
    process group, ``RuntimeError``. Device type "cpu" under gloo.
    """
    device_type = _mesh_device_type()
    shape = (sizes if sizes is not None else ParallelismSizes()).mesh_shape(dist.get_world_size())
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIM_NAMES)
    for name, dims in FLATTENED_DIMS.items():
        # torch keeps flattened dims on the root mesh; a second _flatten with
        # the same name and dims returns the one made here (get_flat_mesh).
        mesh[dims]._flatten(name)
    return mesh


def get_flat_mesh(device_mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The 1-D mesh of dim ``name`` of ``device_mesh``: one of its dims, or a flattened one ("dp", ...).

    A flattened dim not made yet (a mesh not built by
    :func:`create_fsdp2_device_mesh`) is made here, collectively: every rank
    must call it then. ``KeyError`` naming the dims found when ``name`` is
    neither.
    """
    names = device_mesh.mesh_dim_names or ()
    if name in names:
        return device_mesh[name]
    sources = FLATTENED_DIMS.get(name)
    if sources is None or not all(source in names for source in sources):
        raise KeyError(f"mesh dim {name!r} is not a dim of this mesh {names} nor flattened from its dims")
    return device_mesh[sources]._flatten(name)


def _size(device_mesh: DeviceMesh, name: str) -> int:
    return device_mesh[name].size() if name in (device_mesh.mesh_dim_names or ()) else 1


def get_fsdp_dp_mesh(device_mesh: DeviceMesh) -> DeviceMesh:
    """The mesh ``fully_shard`` shards over: ``dp_shard`` (FSDP), or ``(dp_replicate, dp_shard)`` (HSDP).

    HSDP when ``device_mesh`` has a ``dp_replicate`` dim of size > 1, as
    upstream's ``get_fsdp_dp_mesh`` chooses. Beyond upstream, a 1-D mesh
    with no dim names or one data-parallel name (``dp_shard``, ``dp``,
    ``dp_shard_cp``, ``dp_cp``) is sharded over as it is. Raises
    ``ValueError`` for a dim name outside upstream's axis names or a mesh
    with no ``dp_shard`` dim, and ``NotImplementedError`` for a ``cp``,
    ``pp`` or ``ep`` dim of size > 1 (a ``tp`` dim is tensor parallelism's,
    left to :mod:`nemo_dist.distributed.tensor_parallel`).
    """
    names: Any = device_mesh.mesh_dim_names
    if names is None:
        if device_mesh.ndim == 1:
            return device_mesh
        raise ValueError(
            f"a {device_mesh.ndim}-D DeviceMesh without dim names: name its dims "
            "('dp_replicate', 'dp_shard') for HSDP, or build it with create_fsdp2_device_mesh()"
        )
    unknown = [name for name in names if name not in _KNOWN_DIMS]
    if unknown:
        raise ValueError(f"device_mesh has unknown dim names {unknown}; allowed names are {sorted(_KNOWN_DIMS)}")
    for name, kind in _UNSUPPORTED_DIMS.items():
        if _size(device_mesh, name) > 1:
            raise _not_supported(f"device_mesh dim {name!r} of size", _size(device_mesh, name), kind)
    if len(names) == 1 and names[0] in _DATA_PARALLEL_DIMS:
        return device_mesh
    if "dp_shard" not in names:
        raise ValueError(f"device_mesh needs a 'dp_shard' dim to shard over; its dims are {tuple(names)}")
    if _size(device_mesh, "dp_replicate") > 1:
        return device_mesh["dp_replicate", "dp_shard"]
    return device_mesh["dp_shard"]
