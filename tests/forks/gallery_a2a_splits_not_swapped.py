"""An autograd all-to-all whose backward sends the gradient back with the forward's split sizes, not swapped
(``all_to_all_single(grad, output_split_sizes, input_split_sizes)`` copied from the forward): right only when every
rank sends each rank as many rows as it receives from it.

Broken: a2a.backward_returns_each_row_its_gradient fails (and the checks that run backward on uneven splits).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import exchange


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
        ctx.received, ctx.sent, ctx.group = received, sent, group
        return exchange(tensor, received, sent, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return exchange(grad, ctx.received, ctx.sent, ctx.group), None, None, None


def all_to_all(
    tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
) -> torch.Tensor:
    """The Function applied with torch's parameter names."""
    return _AllToAll.apply(tensor, output_split_sizes, input_split_sizes, group)
