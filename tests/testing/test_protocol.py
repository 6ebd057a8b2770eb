"""Harness layer 0 (no process group): what crosses between parent and ranks comes back as it went.

Both sides pickle calls and results with ``_protocol.dumps``, which writes a
plain contiguous CPU tensor as its raw bytes; every other tensor, and every
other object, pickles as torch and Python pickle it.
"""

from __future__ import annotations

import pickle

import torch
from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.testing._protocol import dumps

_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.bool
]


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(a) is type(b)
    assert (a.dtype, a.shape, a.stride(), a.requires_grad) == (b.dtype, b.shape, b.stride(), b.requires_grad)
    assert torch.equal(a.detach(), b.detach())


@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_a_tensor_round_trips_with_dtype_shape_strides_and_values(
    dtype: torch.dtype, shape: list[int], seed: int
) -> None:
    """Any plain tensor comes back equal bit for bit, with the same dtype, shape and strides."""
    generator = torch.Generator().manual_seed(seed)
    tensor = (torch.randn(shape, generator=generator, dtype=torch.float64) * 100).to(dtype)
    _same(pickle.loads(dumps(tensor)), tensor)


def test_views_subclasses_and_grad_leaves_keep_what_torch_pickles() -> None:
    """Non-contiguous views, offsets, odd strides, Parameters and leaves requiring grad come back as they went."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = [
        base.t(),
        base[1:],
        base[:, ::2],
        torch.empty_strided((2, 1), (1, 5)).fill_(3.0),
        torch.nn.Parameter(torch.ones(3)),
        torch.zeros(2, requires_grad=True),
        torch.randn(3, dtype=torch.complex64),
        torch.randn(2).conj(),
    ]
    for sent, got in zip(tensors, pickle.loads(dumps(tensors)), strict=True):
        _same(got, sent)
        assert got.is_conj() == sent.is_conj()


def test_one_tensor_sent_twice_arrives_as_one_object() -> None:
    """The pickle memo holds: a tensor appearing twice in a message is one tensor after it."""
    tensor = torch.randn(5)
    first, second = pickle.loads(dumps([tensor, tensor]))
    assert first is second
