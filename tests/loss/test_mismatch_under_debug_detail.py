"""Layer 2 (a 3-rank gloo world started with TORCH_DISTRIBUTED_DEBUG=DETAIL).

On the default (equal shapes) path, shapes that differ between ranks are the
caller's bug and the gather adds no collective to detect them; torch's DETAIL
debug mode must then report the mismatch on every rank, for these functions as
for torch's own collectives, and leave the world usable.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from nemo_dist.loss.dist_utils import all_gather_no_grad, all_gather_with_grad
from nemo_dist.testing import World


@pytest.fixture(scope="module")
def detail_world() -> Iterator[World]:
    """A 3-rank world whose ranks start with TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        world = World(3, timeout=60.0)
        world.start()
    with world:
        yield world


def _gather_rank_dependent_rows(grad: bool) -> str:
    x = torch.zeros(2 + dist.get_rank(), 3, requires_grad=grad)
    try:
        (all_gather_with_grad if grad else all_gather_no_grad)(x)
    except RuntimeError as error:
        return str(error)
    return "no error"


def _gather_equal_rows() -> list[float]:
    return all_gather_no_grad(torch.full((1,), float(dist.get_rank()))).tolist()


@pytest.mark.parametrize("grad", [True, False], ids=["with_grad", "no_grad"])
def test_mismatched_rows_are_reported_on_every_rank_under_detail(detail_world: World, grad: bool) -> None:
    """Every rank raises torch's 'Detected mismatch between collectives' naming its own shape."""
    messages = detail_world.run(_gather_rank_dependent_rows, grad)
    for rank, message in enumerate(messages):
        assert "Detected mismatch between collectives" in message, (rank, message)
        assert f"TensorShape=[{2 + rank}, 3]" in message, (rank, message)
    assert detail_world.run(_gather_equal_rows) == [[0.0, 1.0, 2.0]] * 3
