"""Gallery wrapper, correct: HSDP, FSDP2 over a 2-D (replicate, shard) mesh; also plain FSDP over a 1-D one.

Pattern (torchtitan's and torchtune's HSDP, re-expressed): the same
per-block ``fully_shard`` as FSDP, over a 2-D mesh ``(dp_replicate,
dp_shard)``: parameters sharded within a replica group, replicated across
groups; FSDP reduce-scatters within a group and all-reduces across groups,
so the gradient is the mean over every data-parallel rank. Over a 1-D mesh
it is plain FSDP. It broadcasts nothing (``--ddp-start identical``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["apply_hsdp"]


def apply_hsdp(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` block by block over ``mesh`` (2-D: HSDP; 1-D: FSDP), gradients averaged (FSDP's default)."""
    shard_blocks_then_root(model, mesh)
    return model
