"""An autograd all-to-all whose backward sends the gradient back with the forward's split sizes, not swapped
(``all_to_all_single(grad, output_split_sizes, input_split_sizes)`` copied from the forward): right only when every
rank sends each rank as many rows as it receives from it.

Broken: a2a.backward_returns_each_row_its_gradient fails (and the checks that run backward on uneven splits).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import all_to_all_with, exchange


def _backward(grad: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The gradient sent with the forward's split sizes."""
    return exchange(grad, received, sent, group)


all_to_all = all_to_all_with(_backward)
