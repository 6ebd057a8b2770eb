"""What the all-to-all gallery rows share: the raw uneven exchange, outside autograd."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def exchange(tensor: torch.Tensor, received: Sequence[int] | None, sent: Sequence[int] | None, group: Any) -> torch.Tensor:
    """``sent[j]`` rows of ``tensor`` to rank j, ``received[i]`` rows from rank i (None: equal splits), in order."""
    size = dist.get_world_size(group)
    rows = sum(received) if received is not None else tensor.shape[0]
    out = tensor.new_empty((rows, *tensor.shape[1:]))
    dist.all_to_all_single(
        out, tensor.contiguous(), None if received is None else list(received), None if sent is None else list(sent),
        group=group,
    )
    del size
    return out
