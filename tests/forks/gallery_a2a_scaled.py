"""An autograd all-to-all whose backward scales the routed gradient by the group size, written to undo a loss
averaged over ranks where the inverse all-to-all is already exact: expert-parallel gradients come out a whole
multiple of the right ones (the class of pytorch issue 160285, gradients exactly 2x on two ranks).

Broken: a2a.backward_returns_each_row_its_gradient fails, naming the multiple.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks._all_to_all import exchange


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
        ctx.received, ctx.sent, ctx.group = received, sent, group
        return exchange(tensor, received, sent, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        routed = exchange(grad, ctx.sent, ctx.received, ctx.group)
        return routed * dist.get_world_size(ctx.group), None, None, None


def all_to_all(
    tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
) -> torch.Tensor:
    """The Function applied with torch's parameter names."""
    return _AllToAll.apply(tensor, output_split_sizes, input_split_sizes, group)
