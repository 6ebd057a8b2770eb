"""Layer 2: a gloo world of 2 ranks. Every invalid input of the reference gather, with its message.

Each case runs on both ranks; the rank function catches the exception and
returns its type and message, so the world stays healthy. Every rank must
raise (no rank may hang in a collective the others never enter).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from nemo_dist.conformance.engine.target import REFERENCE
from nemo_dist.conformance.suites.gather import ranks as ranks
from nemo_dist.testing.plugin import WorldFactory

f32, f64 = torch.float32, torch.float64

# id: (per-rank inputs, function, keyword options, {rank: (exception type, message pattern)}; -1 = every rank)
CASES: dict[str, tuple[list[Any], str, dict[str, Any], dict[int, tuple[str, str]]]] = {
    "0-d-with-grad": ([torch.tensor(1.0), torch.tensor(2.0)], "with_grad", {}, {-1: ("ValueError", r"0-d tensor")}),
    "0-d-no-grad": ([torch.tensor(1), torch.tensor(2)], "no_grad", {}, {-1: ("ValueError", r"0-d tensor")}),
    "0-d-uneven": (
        [torch.tensor(1.0), torch.tensor(2.0)],
        "with_grad",
        {"uneven": True},
        {-1: ("ValueError", r"0-d tensor")},
    ),
    "0-d-on-one-rank-uneven": (
        [torch.zeros(2, 3), torch.tensor(2.0)],
        "with_grad",
        {"uneven": True},
        {-1: ("ValueError", r"0-d tensors cannot be gathered on dim 0 \(ranks \[1\]\)")},
    ),
    "not-a-tensor": ([[1.0], [2.0]], "with_grad", {}, {-1: ("TypeError", r"expected a torch\.Tensor, got list")}),
    "not-a-tensor-no-grad": ([3, 4], "no_grad", {}, {-1: ("TypeError", r"expected a torch\.Tensor, got int")}),
    "uneven-trailing-dims-differ": (
        [torch.zeros(1, 2), torch.zeros(2, 3)],
        "with_grad",
        {"uneven": True},
        {-1: ("ValueError", r"trailing dims .*rank 0: shape \(1, 2\).*rank 1: shape \(2, 3\)")},
    ),
    "uneven-dtypes-differ": (
        [torch.zeros(1, 2, dtype=f32), torch.zeros(1, 2, dtype=f64)],
        "no_grad",
        {"uneven": True},
        {-1: ("ValueError", r"dtypes differ .*rank 0: .*float32.*rank 1: .*float64")},
    ),
    "uneven-ndim-differ": (
        [torch.zeros(2), torch.zeros(2, 1)],
        "with_grad",
        {"uneven": True},
        {-1: ("ValueError", r"trailing dims .*rank 0: shape \(2,\).*rank 1: shape \(2, 1\)")},
    ),
    "not-a-member-of-group": (
        [torch.zeros(1), torch.zeros(1)],
        "with_grad",
        {"group_partition": [[0], [1]], "group_of": 0},
        {0: ("no error", r"returned shape \(1,\)"), 1: ("ValueError", r"not a member of the given group")},
    ),
}


@pytest.mark.parametrize(("inputs", "function", "options", "expected"), CASES.values(), ids=CASES.keys())
def test_invalid_input_raises_clear_error_on_every_rank(
    world_factory: WorldFactory,
    inputs: list[Any],
    function: str,
    options: dict[str, Any],
    expected: dict[int, tuple[str, str]],
) -> None:
    """Each invalid input raises the stated exception type with a message saying what is wrong, on every rank."""
    results = world_factory(2).run(ranks.raises, REFERENCE, inputs, function, **options)
    for r, (kind, message) in enumerate(results):
        want_kind, pattern = expected.get(r, expected.get(-1, ("?", "")))
        assert kind == want_kind, f"rank {r}: {kind}: {message} (expected {want_kind})"
        assert re.search(pattern, message), f"rank {r}: message {message!r} does not match {pattern!r}"
