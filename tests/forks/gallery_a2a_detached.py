"""Token routing with a plain ``dist.all_to_all_single`` into a fresh buffer: the result is outside autograd, so
nothing upstream of the dispatch (the router, the tokens' producers) gets a gradient through it. The class of
NeMo AutoModel PR 2995 (routing probabilities moved with a plain collective, the router detached from the loss).

Broken: a2a.forward_routes_rows_in_rank_order (its output needs no grad) and
a2a.backward_returns_each_row_its_gradient (the sent rows get none) fail, naming the detach.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import exchange


def all_to_all(
    tensor: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], group: Any
) -> torch.Tensor:
    """The raw collective: right rows, no autograd."""
    return exchange(tensor.detach(), output_split_sizes, input_split_sizes, group)
