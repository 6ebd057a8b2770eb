"""Layer 0 (no process group): the gather outside a distributed world.

The pytest process never initialises torch.distributed (ranks live in the
harness's subprocesses), so these run in the plain test process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from nemo_dist.loss.dist_utils import _AllGatherWithGrad, all_gather_no_grad, all_gather_with_grad


@pytest.fixture(autouse=True)
def _no_process_group() -> None:
    assert not dist.is_initialized()


def test_with_grad_returns_input_itself_when_uninitialised() -> None:
    """Without a process group the gather is the identity: the very same tensor object."""
    x = torch.randn(3, 2, requires_grad=True)
    assert all_gather_with_grad(x) is x
    assert all_gather_with_grad(x, uneven=True) is x


def test_with_grad_keeps_gradient_flowing_when_uninitialised() -> None:
    """The identity keeps x in the graph, so the loss's gradient reaches x unchanged."""
    x = torch.randn(3, 2, requires_grad=True)
    weights = torch.arange(6.0).reshape(3, 2)
    (all_gather_with_grad(x) * weights).sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, weights)


def test_no_grad_returns_detached_equal_tensor_when_uninitialised() -> None:
    """all_gather_no_grad gives x's values, never attached to the graph."""
    x = torch.randn(4, 3, requires_grad=True)
    out = all_gather_no_grad(x)
    assert not out.requires_grad
    assert torch.equal(out, x.detach())


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16], ids=str)
def test_no_grad_moves_any_dtype_when_uninitialised(dtype: torch.dtype) -> None:
    """Integer and bool tensors pass through all_gather_no_grad unchanged."""
    x = torch.tensor([[1, 0], [0, 1]]).to(dtype)
    out = all_gather_no_grad(x)
    assert out.dtype == dtype
    assert torch.equal(out, x)


def test_tuple_function_returns_one_part_when_uninitialised() -> None:
    """_AllGatherWithGrad.apply gives a one-tuple equal to x and passes the gradient back."""
    x = torch.randn(2, 3, requires_grad=True)
    (part,) = _AllGatherWithGrad.apply(x)
    assert torch.equal(part, x.detach())
    part.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, torch.ones(2, 3))


@pytest.mark.parametrize(
    ("call", "bad", "error", "message"),
    [
        pytest.param(all_gather_with_grad, torch.tensor(1.0), ValueError, "0-d", id="with_grad-0d"),
        pytest.param(all_gather_no_grad, torch.tensor(1.0), ValueError, "0-d", id="no_grad-0d"),
        pytest.param(
            all_gather_with_grad, [1.0, 2.0], TypeError, "expected a torch.Tensor, got list", id="with_grad-list"
        ),
        pytest.param(all_gather_no_grad, 3, TypeError, "expected a torch.Tensor, got int", id="no_grad-int"),
    ],
)
def test_bad_input_raises_naming_the_problem(
    call: Callable[[Any], torch.Tensor], bad: Any, error: type[Exception], message: str
) -> None:
    """Invalid inputs raise a typed error whose message says what was wrong, even with no world."""
    with pytest.raises(error, match=message):
        call(bad)
