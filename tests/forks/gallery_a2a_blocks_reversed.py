"""An autograd all-to-all whose backward lays the returned gradient blocks out in reverse rank order (a
hand-written exchange that walks the peers from the last): each sent row gets another row's gradient.

Broken: a2a.backward_returns_each_row_its_gradient fails, naming permuted rows.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.forks._all_to_all import all_to_all_with, exchange


def _backward(grad: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The inverse all-to-all, its blocks laid out from the last rank's."""
    blocks = torch.split(exchange(grad, sent, received, group), sent)
    return torch.cat(blocks[::-1])


all_to_all = all_to_all_with(_backward)
