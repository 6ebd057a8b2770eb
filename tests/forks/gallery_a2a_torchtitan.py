"""torchtitan's expert-parallel token dispatch: the tokens-per-rank counts are exchanged first with a plain
``all_to_all_single``, then the tokens go through ``_functional_collectives.all_to_all_single_autograd`` with the
learned output splits, so a receiver never needs to know what it will get.

Correct. ``--a2a-fn tests.forks.gallery_a2a_torchtitan:dispatch`` (it takes only ``input_split_sizes``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd


def dispatch(tokens: torch.Tensor, input_split_sizes: list[int], group: Any) -> torch.Tensor:
    """Send ``input_split_sizes[j]`` tokens to rank j; the counts each rank sends here are learned first."""
    sent = torch.tensor(input_split_sizes, dtype=torch.int64)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    out = all_to_all_single_autograd(tokens, received.tolist(), input_split_sizes, group)
    return torch.distributed._functional_collectives.wait_tensor(out)
