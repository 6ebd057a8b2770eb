"""An autograd all-to-all whose backward sends the gradient in bfloat16 to halve its traffic and casts it back, as
communication-compressing MoE dispatchers do: every gradient of a float32 or float64 call is rounded.

Broken: a2a.backward_returns_each_row_its_gradient fails, naming the rounding through bfloat16.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import all_to_all_with, exchange


def _backward(grad: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The inverse all-to-all, exchanged in bfloat16."""
    return exchange(grad.to(torch.bfloat16), sent, received, group).to(grad.dtype)


all_to_all = all_to_all_with(_backward)
