"""Layer 2: gloo worlds of 2 to 4 ranks. The words of two extended gather checks' failures, for ``--gather-fn``.

- ``gather.zero_dim_raises_on_every_rank`` shows what each rank's call of a
  0-d tensor itself raised or returned, never an error of the checker's own
  combining of a returned tuple or stack (the tuple-returning
  ``GatherLayer``, the Lightning-style stacked ``AllGather``, the
  torchmetrics-style list gather), and the callable's own error when it raises;
- ``gather.group_uses_group_ranks`` names a likely cause where the ranks'
  reports fit one: the torchmetrics-style list gather's missing cross-rank
  sum (the same inside a subgroup as in the whole world), a gather over the
  whole world instead of the group, the local slot put at the global rank,
  and other wrong rows listed member by member.

Each runs through the same selection and runner as ``nemo-dist-conformance
--gather-fn MODULE:NAME`` (as ``tests/conformance/test_gallery.py`` does) and
asserts on the report's text.
"""

from __future__ import annotations

import pytest
import torch

from nemo_dist.conformance import Implementation, Report, load_checks, run_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.suites.gather.diagnosis import CAUSES
from nemo_dist.conformance.suites.gather.target import _as_cat, describe
from nemo_dist.testing.plugin import WorldFactory

ZERO_DIM = "gather.zero_dim_raises_on_every_rank"
GROUP = "gather.group_uses_group_ranks"
TORCHMETRICS = "tests.forks.gallery_gather_all_tensors:gather_all_tensors"
STACKED = "tests.forks.gallery_stacked_global_rank:AllGather"
HELPERS = "tests.conformance._group_gathers"


def _report(spec: str, check: str, sizes: tuple[int, ...], world_factory: WorldFactory) -> tuple[Report, str]:
    """Run the one check ``check`` on the callable ``spec`` in worlds of ``sizes``: the report and its text."""
    impl = Implementation(gather=None, gather_fn=spec)
    (found,) = [c for c in load_checks().values() if c.name == check]
    report = run_checks(
        [found], impl, sizes, max_examples=10, timeout=60, worlds=world_factory, components=("gather",)
    )
    return report, format_report(report)


#: (callable, what each rank's call of a 0-d tensor did, as the failure words it, in a world of 2).
ZERO_DIM_CALLS = {
    "tuple": (
        "tests.forks.gallery_gather_layer_summed:GatherLayer",
        "raised nothing; returned a tuple of 2 tensors of shape ()",
    ),
    "stacked": (STACKED, "raised nothing; returned shape (2,)"),
    "list": (TORCHMETRICS, "raised nothing; returned a list of 2 tensors of shape ()"),
    "raises": (
        "tests.forks.gallery_gather_features_local_slot:gather_features",
        "raised RuntimeError: zero-dimensional tensor (at position 0) cannot be concatenated",
    ),
}


@pytest.mark.parametrize(("spec", "did"), ZERO_DIM_CALLS.values(), ids=ZERO_DIM_CALLS.keys())
def test_zero_dim_failure_shows_what_the_callable_itself_did(
    spec: str, did: str, world_factory: WorldFactory
) -> None:
    """The 0-d failure names the callable and each rank's own outcome, never the checker's combining error."""
    report, text = _report(spec, ZERO_DIM, (2,), world_factory)
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail", text
    assert f"rank 0: {spec} of a 0-d tensor should raise ValueError; each rank's call:" in text
    lines = [line.strip() for line in text.splitlines()]
    assert f"rank 0: {did}" in lines, text
    assert f"rank 1: {did}" in lines, text
    if did.startswith("raised nothing"):
        # What only the checker's own combining of the returned value raised.
        assert "cannot be concatenated" not in text
        assert "the stacked form needs" not in text


def test_combining_a_gather_of_0d_tensors_says_why_without_contradicting_itself() -> None:
    """Where the checker cannot combine a return (a stack or tuple of 0-d tensors), it says so, in its own words."""
    x = torch.tensor(1.0)
    with pytest.raises(TypeError) as stacked:
        _as_cat(torch.zeros(2), x, "auto", "f", world_size=2)
    assert str(stacked.value) == "f returned shape (2,) for a 0-d x; 0-d tensors have no dim 0 to concatenate on"
    with pytest.raises(TypeError) as listed:
        _as_cat([torch.zeros(()), torch.zeros(())], x, "auto", "f", world_size=2)
    assert str(listed.value) == (
        "f returned a list of 2 tensors for a 0-d x; 0-d tensors have no dim 0 to concatenate on"
    )
    with pytest.raises(TypeError) as flat:
        _as_cat(torch.zeros(4), torch.zeros(2), "stacked", "f", world_size=2)
    assert str(flat.value) == "f returned shape (4,) for x of shape (2,); the stacked form needs [W, *x.shape]"


def test_describe_puts_any_return_in_words() -> None:
    """Tensors by shape, tuples and lists by length and their items' shapes or types."""
    t = torch.zeros(2, 3)
    assert describe(t) == "shape (2, 3)"
    assert describe(None) == "None"
    assert describe(3) == "a value of type int"
    assert describe([]) == "an empty list"
    assert describe([t]) == "a list of 1 tensor of shape (2, 3)"
    assert describe((t, t)) == "a tuple of 2 tensors of shape (2, 3)"
    assert describe((t, torch.zeros(3))) == "a tuple of 2 tensors of shapes (2, 3), (3,)"
    assert describe((t, [2, 2])) == "a tuple of 2 (tensor of shape (2, 3), list)"


def test_torchmetrics_style_gather_in_a_subgroup_names_the_missing_cross_rank_sum(
    world_factory: WorldFactory,
) -> None:
    """Its group rank is right; its gradient is its own loss's alone, in a subgroup as in the whole world."""
    report, text = _report(TORCHMETRICS, GROUP, (3,), world_factory)
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail", text
    cause = CAUSES["subgroup_as_world"].format(cause=CAUSES["own"])
    assert cause == (
        "no cross-rank sum (each rank keeps only its own loss's gradient), inside a subgroup as in the whole "
        "world (not a group rank mix-up)"
    )
    assert verdict.cause == cause, text
    assert f"Likely cause: {cause}" in text


def test_a_gather_ignoring_its_group_is_named_as_gathering_over_the_world(world_factory: WorldFactory) -> None:
    """Every member's output holds every rank's rows: named in worlds of 3 and 4."""
    report, text = _report(f"{HELPERS}:gather_ignoring_group", GROUP, (3, 4), world_factory)
    assert [(v.world_size, v.outcome) for v in report.verdicts] == [(3, "fail"), (4, "fail")], text
    assert all(v.cause == CAUSES["group_ignored"] for v in report.verdicts), text
    assert (
        "Likely cause: gathers over the whole world instead of the group (each member's output holds every "
        "rank's rows)"
    ) in text


def test_the_local_slot_at_the_global_rank_is_named_from_the_rows_gathered(world_factory: WorldFactory) -> None:
    """Own rows in the global rank's slot (an IndexError past the group's end): the global-rank mix-up."""
    report, text = _report(f"{HELPERS}:local_slot_at_global_rank", GROUP, (3, 4), world_factory)
    assert [(v.world_size, v.outcome) for v in report.verdicts] == [(3, "fail"), (4, "fail")], text
    assert all(v.cause == CAUSES["subgroup_global_rank"] for v in report.verdicts), text


def test_other_wrong_rows_are_listed_member_by_member_without_a_rank_mix_up(world_factory: WorldFactory) -> None:
    """The local slot at the global rank modulo the group's size fits no mix-up: the rows are listed instead."""
    report, text = _report(f"{HELPERS}:local_slot_modulo", GROUP, (3,), world_factory)
    (verdict,) = report.verdicts
    assert verdict.outcome == "fail", text
    prefix = CAUSES["group_wrong_rows"].split("{rows}")[0]
    assert verdict.cause.startswith(prefix), text
    assert " got the rows of ranks [" in verdict.cause, text
    assert CAUSES["subgroup_global_rank"] not in text
    assert CAUSES["subgroup_first_member"] not in text


def test_the_stacked_gather_keeps_its_global_rank_cause(world_factory: WorldFactory) -> None:
    """Its rows are right in a subgroup, its backward indexes by the global rank: the cause is unchanged."""
    report, text = _report(STACKED, GROUP, (3,), world_factory)
    (verdict,) = report.verdicts
    assert (verdict.outcome, verdict.cause) == ("fail", CAUSES["subgroup_global_rank"]), text
