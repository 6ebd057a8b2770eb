"""Broken FSDP2 fork (test fixture): under HSDP it shards over ``dp_shard`` alone, so replicas never sync (upstream #3135).

Guarded by ``fsdp2.trains_like_one_process``: after a few optimizer steps
every HSDP replica must hold the parameters of one process stepping the
whole batch; here each replica averages its gradients within itself and the
replicas drift apart (``fsdp2.shards_over_the_data_parallel_dims`` also sees
a 1-D ``dp_shard`` placement where ``(Replicate, Shard)`` is due). Plain FSDP
(``dp_replicate`` 1) is unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from nemo_dist.distributed import fsdp2 as _reference
from nemo_dist.distributed.fsdp2 import FSDP2Config, get_sync_ctx
from nemo_dist.distributed.mesh import get_fsdp_dp_mesh
from tests.forks import fsdp2_fork

__all__ = ["FSDP2Config", "FSDP2Manager", "fsdp2_strategy_parallelize", "get_sync_ctx"]


def _parallelize(model: nn.Module, config: FSDP2Config, device_mesh: Any, reapply_trainability: Any) -> nn.Module:
    """The reference's, except that an HSDP mesh is cut down to its ``dp_shard`` dim (the deliberate bug)."""
    if get_fsdp_dp_mesh(device_mesh).ndim == 2:
        device_mesh = device_mesh["dp_shard"]
    return _reference._parallelize(model, config, device_mesh, reapply_trainability)


FSDP2Manager, fsdp2_strategy_parallelize = fsdp2_fork(
    _parallelize, "The reference manager, except that under HSDP it shards within each replica and never syncs them."
)
