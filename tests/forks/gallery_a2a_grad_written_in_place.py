"""An autograd all-to-all whose backward reuses the incoming gradient's buffer for the inverse exchange where the
shapes allow (every rank receives what it sends), to save an allocation: the gradient autograd handed it is
overwritten. Its results are right; the caller's gradient buffer, which autograd may hand to other consumers, is not.

Broken: a2a.inputs_and_grads_not_modified and a2a.backward_returns_each_row_its_gradient fail, naming the in-place
write (the gradients themselves are right).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.forks._all_to_all import all_to_all_with, exchange


def _backward(grad: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The inverse all-to-all, into ``grad`` itself when its shape is the result's."""
    if list(received) != list(sent):
        return exchange(grad, sent, received, group)
    source = grad.clone()
    dist.all_to_all_single(grad, source, list(sent), list(received), group=group)
    return grad


all_to_all = all_to_all_with(_backward)
