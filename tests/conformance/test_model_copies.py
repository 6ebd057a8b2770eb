"""Layer 1 (one process): the rank side's model copies and the batched closeness test.

:func:`~nemo_dist.conformance.suites.ddp.templates.fresh_copy` stands in for
``copy.deepcopy`` of a built model in every DDP check, and
:func:`~nemo_dist.conformance.suites.ddp.expectations.lists_plainly_close` for a
comparison per tensor pair: each must answer exactly as what it replaces.
"""

from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from nemo_dist.conformance.suites.ddp.expectations import TOLERANCE_FLOAT64, _plainly_close, lists_plainly_close
from nemo_dist.conformance.suites.ddp.models import _MultimodalModel
from nemo_dist.conformance.suites.ddp.templates import fresh_copy, manual_seed, seeded_template
from tests import targets


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight
        self.shared = nn.Linear(3, 3)
        self.again = self.shared  # one module reached by two names
        self.register_buffer("counts", torch.zeros(2))
        self.settings = {"scale": [1.0]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.again(self.shared(self.embed(x)))) * self.settings["scale"][0]


def _train_once(model: nn.Module) -> list[torch.Tensor]:
    model(torch.tensor([[0, 1, 4]])).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_fresh_copy_trains_like_a_deepcopy_and_leaves_the_original_untouched() -> None:
    torch.manual_seed(0)
    model = _Tied()
    original = [p.detach().clone() for p in model.parameters()]
    fresh, deep = fresh_copy(model), copy.deepcopy(model)
    assert [torch.equal(a, b) for a, b in zip(_train_once(fresh), _train_once(deep), strict=True)] == [True] * 3
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), original, strict=True))


def test_fresh_copy_keeps_ties_and_shares_no_mutable_state() -> None:
    model = _Tied()
    fresh = fresh_copy(model)
    assert fresh.head.weight is fresh.embed.weight
    assert fresh.head.weight is not model.embed.weight
    assert fresh.again is fresh.shared
    assert fresh.shared is not model.shared
    assert fresh.counts is not model.counts
    assert torch.equal(fresh.counts, model.counts)
    fresh.settings["scale"][0] = 2.0
    fresh.register_forward_hook(lambda *args: None)
    fresh.shared.weight.requires_grad_(False)
    assert model.settings["scale"] == [1.0]
    assert not model._forward_hooks
    assert model.shared.weight.requires_grad


class _CopiedItsWay(nn.Module):
    """A module that says how it is copied (as the ``kernels`` package's hub layers do)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.copies = 0

    def __deepcopy__(self, memo: dict[int, object]) -> _CopiedItsWay:
        new = type(self)()
        memo[id(self)] = new
        new.linear.load_state_dict(self.linear.state_dict())
        new.copies = self.copies + 1
        return new


def test_fresh_copy_copies_a_module_with_its_own_deepcopy_its_way() -> None:
    model = nn.Sequential(_CopiedItsWay(), nn.Linear(2, 2))
    fresh = fresh_copy(model)
    assert fresh[0].copies == 1
    assert fresh[0] is not model[0]
    assert torch.equal(fresh[0].linear.weight, model[0].linear.weight)


def test_manual_seed_draws_as_torch_manual_seed_does() -> None:
    torch.manual_seed(3)
    expected = (torch.rand(4), torch.randn(2, 3), torch.randint(0, 100, (5,)))
    torch.manual_seed(99)
    manual_seed(3)
    found = (torch.rand(4), torch.randn(2, 3), torch.randint(0, 100, (5,)))
    assert all(torch.equal(a, b) for a, b in zip(expected, found, strict=True))
    assert torch.initial_seed() == 3


def test_seeded_template_matches_building_and_leaves_the_generator_as_building_does() -> None:
    torch.manual_seed(6)
    built = _MultimodalModel().to(torch.float64)
    after_build = torch.rand(3)
    first = seeded_template(_MultimodalModel, 6, torch.float64)
    after_first = torch.rand(3)
    second = seeded_template(_MultimodalModel, 6, torch.float64)
    after_second = torch.rand(3)
    assert torch.equal(after_build, after_first)
    assert torch.equal(after_first, after_second)
    assert first is not second
    for a, b, c in zip(built.parameters(), first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a, c)
        assert b is not c


def test_fresh_copy_of_a_real_transformers_model_trains_like_a_deepcopy() -> None:
    targets.import_target("transformers")
    from nemo_dist.conformance.suites.real_models import ranks

    for name, arch in ranks.ARCHITECTURES.items():
        model = seeded_template(arch.build, 20, torch.float64)
        losses, grads = [], []
        for copied in (fresh_copy(model), copy.deepcopy(model)):
            loss = ranks._loss(arch, copied, copied)
            loss.backward()
            losses.append(loss.detach())
            grads.append([p.grad for p in copied.parameters()])
        assert torch.equal(losses[0], losses[1]), name
        for a, b in zip(*grads, strict=True):
            assert (a is None and b is None) or torch.equal(a, b), name


_tensors = st.lists(st.floats(-4, 4, width=32) | st.just(float("nan")), min_size=1, max_size=6).map(
    lambda xs: torch.tensor(xs, dtype=torch.float64)
)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(_tensors, st.floats(-1e-9, 1e-9), st.booleans()), max_size=5))
def test_lists_plainly_close_answers_as_each_pair_asked_alone(pairs: list[tuple[torch.Tensor, float, bool]]) -> None:
    actual, expected = [], []
    for tensor, nudge, far in pairs:
        actual.append(tensor)
        expected.append(tensor + (1.0 if far else nudge))
    each = all(_plainly_close(a, e, TOLERANCE_FLOAT64) for a, e in zip(actual, expected, strict=True))
    assert lists_plainly_close(actual, expected, TOLERANCE_FLOAT64) == each


def test_lists_plainly_close_defers_on_mismatched_pairs() -> None:
    a = torch.zeros(2, dtype=torch.float64)
    assert lists_plainly_close([None, a], [None, a.clone()], TOLERANCE_FLOAT64)
    assert not lists_plainly_close([a], [None], TOLERANCE_FLOAT64)
    assert not lists_plainly_close([a], [a.float()], TOLERANCE_FLOAT64)
    assert not lists_plainly_close([a], [a.reshape(1, 2)], TOLERANCE_FLOAT64)
    assert not lists_plainly_close([a.long()], [a.long()], TOLERANCE_FLOAT64)
    assert not lists_plainly_close([a], [], TOLERANCE_FLOAT64)
