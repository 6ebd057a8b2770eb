"""Broken FSDP2 fork (test fixture): under HSDP it shards over ``("dp_shard", "dp_replicate")``, the dims swapped.

Guarded by ``fsdp2.shards_over_the_data_parallel_dims``: under HSDP each
parameter must be replicated over ``dp_replicate`` and sharded over
``dp_shard``; here it is replicated over the shard group and sharded over the
replicate group (the class of upstream #2768: one mesh dim taken for the
other). Gradients are still averaged over every rank, so training matches;
only the layout shows it. Plain FSDP (``dp_replicate`` 1) is unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from nemo_dist.distributed.mesh import get_fsdp_dp_mesh
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's ``_parallelize``, except for the HSDP mesh it shards over (the deliberate bug)."""
    mesh = get_fsdp_dp_mesh(device_mesh)
    if mesh.ndim == 2:
        # device_mesh["dp_shard", "dp_replicate"], which torch refuses to slice (dims out of order): the same
        # two groups, the transposed layout.
        mesh = DeviceMesh.from_group(
            [mesh.get_group("dp_shard"), mesh.get_group("dp_replicate")],
            mesh.device_type,
            mesh.mesh.T,
            mesh_dim_names=("dp_shard", "dp_replicate"),
        )
    if config.activation_checkpointing:
        _reference.apply_activation_checkpointing(
            model, config.activation_checkpointing, config.activation_checkpointing_scope
        )
    if reapply_trainability is not None:
        reapply_trainability(model)
    if not _reference.fsdp2_sharding_enabled(device_mesh):
        return model
    _reference._reject_tied_embeddings_in_lists(model)
    sharder = _reference._Sharder(mesh, config)
    sharder.layers(model)
    sharder.embeddings(model)
    sharder.shard(model, False)
    return model


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that under HSDP it replicates over dp_shard and shards over dp_replicate."
)
