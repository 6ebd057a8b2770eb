"""An autograd all-to-all that takes a ``group`` and ignores it, exchanging over the whole world (a wrapper
written for pure expert parallelism, reused where the expert-parallel group is a subgroup).

Broken: a2a.group_is_honoured fails.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor


def all_to_all(
    tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
) -> torch.Tensor:
    """torch's autograd all-to-all over the whole world, whatever ``group`` says."""
    del group
    return wait_tensor(all_to_all_single_autograd(tensor, output_split_sizes, input_split_sizes, dist.group.WORLD))
