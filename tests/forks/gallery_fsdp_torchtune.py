"""Gallery wrapper, correct: torchtune-style FSDP2 with rank 0's full state dict broadcast after sharding.

Pattern (torchtune's ``shard_model`` then ``load_from_full_model_state_dict``,
re-expressed): rank 0 holds the checkpoint's full state dict (here: its own
model's, taken before sharding); the model is sharded in place, block by
block then the root, and ``set_model_state_dict(..., StateDictOptions(
full_state_dict=True, broadcast_from_rank0=True))`` broadcasts rank 0's
values into every rank's shards. Ranks that built other weights start from
rank 0's, so it conforms without ``--ddp-start identical``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from tests.forks.gallery_fsdp_torchtitan import shard_blocks_then_root

__all__ = ["shard_and_load"]


def shard_and_load(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard ``model`` over ``mesh`` in place, then load rank 0's full state dict into every rank's shards."""
    full = {k: v.detach().clone() for k, v in model.state_dict().items()} if dist.get_rank() == 0 else {}
    shard_blocks_then_root(model, mesh)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model
