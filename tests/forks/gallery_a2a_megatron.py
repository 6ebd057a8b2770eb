"""Megatron-core's ``tensor_parallel.mappings.all_to_all(group, input_, output_split_sizes_=None,
input_split_sizes=None)``: an autograd Function whose backward is the same exchange with the split sizes swapped.

Correct. Checked as ``--a2a-fn tests.forks.gallery_a2a_megatron:all_to_all --a2a-kwarg input_=@input
--a2a-kwarg output_split_sizes_=@output_split_sizes`` (its parameters are not named as torch's).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import exchange


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: Any, input_: torch.Tensor, output_split_sizes: Any, input_split_sizes: Any) -> Any:
        ctx.group, ctx.output_split_sizes, ctx.input_split_sizes = group, output_split_sizes, input_split_sizes
        return exchange(input_, output_split_sizes, input_split_sizes, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return None, exchange(grad, ctx.input_split_sizes, ctx.output_split_sizes, ctx.group), None, None


def all_to_all(group: Any, input_: torch.Tensor, output_split_sizes_: Any = None, input_split_sizes: Any = None) -> Any:
    """Megatron's entry point: the Function applied in its parameter order."""
    return _AllToAll.apply(group, input_, output_split_sizes_, input_split_sizes)
