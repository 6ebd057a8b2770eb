"""Layer 0 (no process group): the pp suite's tiny model takes ``position_ids``, and without them computes what it
always has.

The keyword check (``pp.keyword_inputs_reach_every_stage``) relies on every
layer's output depending on the positions it is given; the other pp checks
call the model without them and must keep their numbers exactly.
"""

from __future__ import annotations

import torch

from nemo_dist.conformance.suites.pp.keywords import packed_positions
from nemo_dist.conformance.suites.pp.models import TinyPipelineLM


def _model() -> TinyPipelineLM:
    torch.manual_seed(23)
    return TinyPipelineLM().double()


def test_the_default_positions_given_as_a_keyword_change_nothing() -> None:
    model, ids = _model(), torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(ids), model(ids, position_ids=torch.arange(6).expand(4, 6)))


def test_packed_positions_restart_inside_every_row() -> None:
    found = packed_positions(6, 6)
    assert all(0 in row[1:].tolist() for row in found)
    assert not any(torch.equal(row, torch.arange(6)) for row in found)


def test_every_layer_computes_something_else_from_packed_positions() -> None:
    model = _model()
    hidden = torch.randn(4, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    packed = packed_positions(4, 6)
    for layer in model.layers.values():
        assert not torch.allclose(layer(hidden), layer(hidden, position_ids=packed))
