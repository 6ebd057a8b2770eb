"""What the all-to-all gallery rows share: the raw uneven exchange outside autograd, and an autograd all-to-all
whose forward is that exchange and whose backward a row supplies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

#: A row's backward: ``(grad, received, sent, group) -> gradient of the sent rows``.
Backward = Callable[[torch.Tensor, list[int], list[int], Any], torch.Tensor]


def exchange(tensor: torch.Tensor, received: Sequence[int] | None, sent: Sequence[int] | None, group: Any) -> torch.Tensor:
    """``sent[j]`` rows of ``tensor`` to rank j, ``received[i]`` rows from rank i (None: equal splits), in order."""
    rows = sum(received) if received is not None else tensor.shape[0]
    out = tensor.new_empty((rows, *tensor.shape[1:]))
    dist.all_to_all_single(
        out, tensor.contiguous(), None if received is None else list(received), None if sent is None else list(sent),
        group=group,
    )
    return out


def all_to_all_with(backward: Backward) -> Callable[[torch.Tensor, list[int], list[int], Any], torch.Tensor]:
    """An all-to-all ``(tensor, output_split_sizes, input_split_sizes, group)``, torch's parameter names, whose
    forward is :func:`exchange` and whose backward is ``backward``."""

    class _AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
            ctx.received, ctx.sent, ctx.group = received, sent, group
            return exchange(tensor, received, sent, group)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return backward(grad, ctx.received, ctx.sent, ctx.group), None, None, None

    def all_to_all(
        tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
    ) -> torch.Tensor:
        return _AllToAll.apply(tensor, output_split_sizes, input_split_sizes, group)

    return all_to_all
