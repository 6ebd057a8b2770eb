"""An autograd all-to-all whose backward lays the returned gradient blocks out in reverse rank order (a
hand-written exchange that walks the peers from the last): each sent row gets another row's gradient.

Broken: a2a.backward_returns_each_row_its_gradient fails, naming permuted rows.
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
        routed = exchange(grad, ctx.sent, ctx.received, ctx.group)
        blocks = torch.split(routed, ctx.sent)
        return torch.cat(blocks[::-1]), None, None, None


def all_to_all(
    tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
) -> torch.Tensor:
    """The Function applied with torch's parameter names."""
    return _AllToAll.apply(tensor, output_split_sizes, input_split_sizes, group)
