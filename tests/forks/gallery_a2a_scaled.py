"""An autograd all-to-all whose backward scales the routed gradient by the group size, written to undo a loss
averaged over ranks where the inverse all-to-all is already exact: expert-parallel gradients come out a whole
multiple of the right ones (the class of pytorch issue 160285, gradients exactly 2x on two ranks).

Broken: a2a.backward_returns_each_row_its_gradient fails, naming the multiple.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks._all_to_all import all_to_all_with, exchange


def _backward(grad: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The inverse all-to-all, times the group size."""
    return exchange(grad, sent, received, group) * dist.get_world_size(group)


all_to_all = all_to_all_with(_backward)
