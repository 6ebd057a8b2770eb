"""Name the likely cause of a failing subgroup check (``group=``) by re-running its example in variants.

The variants, in order, each naming a cause only where the ranks' reports fit it:

- the rows each member gathered, from inputs whose rows name their rank (when
  the whole world gathers them right): every rank's rows on every member is
  "gathers over the whole world instead of the group"; each member's own
  rows in the slot of its global rank (an IndexError past the group's end),
  the other slots right, names the global rank used where the group rank
  belongs; any other wrong rows are listed, member by member;
- the same data in the whole world, with distinctive upstream gradients:
  when that passes, the bug is "wrong only inside a subgroup", and a
  gradient (or an IndexError) that follows the global rank, or the global
  rank minus the group's first member's, names the mix-up; when it fails
  with a classic mistake (no cross-rank sum, say, as torchmetrics-style
  ``gather_all_tensors`` shows) and every group's gradients show that same
  mistake, it is named as the same inside a subgroup as in the whole world.

A variant that fails in another way (raises, hangs) counts as no evidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_dist.conformance.engine.deadlines import StepAborted, StepBroke
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.gather import ranks as ranks
from nemo_dist.conformance.suites.gather.diagnosis import (
    CAUSES,
    _attempt,
    _close,
    _distinct_grads,
    _formula,
    _grads_correct,
    _row_sources,
    _run_backward,
)
from nemo_dist.conformance.suites.gather.messages import BothGathers, Gathered, GroupGathered
from nemo_dist.conformance.suites.gather.oracle import expected_grads

__all__ = ["group_cause", "uneven_group_cause"]

#: What a partial run gives: the values of the ranks that returned, and each failing rank's text.
_Partial = tuple[dict[int, Any], dict[int, str]]


def group_cause(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The likely cause of a failing subgroup example (keys: shape, dtype, partition); "" when none fits."""
    size = world.size
    shape, dtype, partition = tuple(example["shape"]), example["dtype"], example["partition"]
    shape = (max(shape[0], 1), *shape[1:])
    rows = _rows_cause(world, impl, partition)
    if rows:
        return rows
    zeros = [torch.zeros(shape, dtype=dtype) for _ in range(size)]
    whole = _distinct_grads(size, (size * shape[0], *shape[1:]), dtype)
    got = _run_backward(world, impl, zeros, "contiguous", whole, "contiguous", "direct", 0)
    if got is None:
        return ""
    if not _grads_correct(got, expected_grads(whole, [shape[0]] * size)):
        return _as_in_the_world(world, impl, zeros, partition, shape, _formula(got, whole, [shape[0]] * size))
    return CAUSES[_rank_mixup(world, impl, zeros, partition, shape) or "subgroup"]


def uneven_group_cause(world: WorldLike, impl: Implementation, example: dict[str, Any]) -> str:
    """The likely cause of a failing ``uneven=True`` subgroup example (keys: shape, dtype, partition); "" if none.

    First what the same groups show with even rows (:func:`group_cause`: the
    bug does not need uneven rows), unless that is only "wrong inside a
    subgroup". Then an uneven example (rank r holds r + 1 rows) in the same
    groups: when exactly the members whose global rank is not their group
    rank fail (a gradient of another member's rows, or an IndexError) and
    the others are right, the uneven path reads the global rank where the
    group rank belongs; a group of one may be right either way (it gathers
    nothing).
    """
    found = group_cause(world, impl, example)
    if found and found != CAUSES["subgroup"]:
        return found
    partition = example["partition"]
    width = tuple(example["shape"][1:])
    counts = [r + 1 for r in range(world.size)]
    inputs = [torch.full((n, *width), float(r + 1), dtype=example["dtype"]) for r, n in enumerate(counts)]
    run = _group_run(world, impl, inputs, partition, uneven=True)
    if run is None:
        return ""
    grads, got, failures = run
    expected: dict[int, torch.Tensor] = {}
    for members in partition:
        slices = expected_grads([grads[m] for m in members], [counts[m] for m in members])
        expected.update(zip(members, slices, strict=True))
    wrong = {r for r in range(world.size) if r in failures or not _close(got.get(r), expected[r])}
    moved = {r for members in partition for position, r in enumerate(members) if r != position}
    # A group of one gathers nothing: its member may be right whatever rank it reads ({1} in {0, 2} and {1}).
    gathering = {r for members in partition if len(members) > 1 for position, r in enumerate(members) if r != position}
    return CAUSES["subgroup_global_rank"] if wrong and wrong in (moved, gathering) else ""


def _partial(world: WorldLike, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Partial | None:
    """``world.run(fn, *args, **kwargs)`` as what each rank returned and each failing rank's text; None when it hung."""
    from nemo_dist.testing import RankFailure

    try:
        return dict(enumerate(world.run(fn, *args, **kwargs))), {}
    except RankFailure as exc:
        return dict(exc.returned), exc.failures
    except StepBroke as exc:
        return dict(exc.failure.returned), exc.failure.failures
    except (Exception, StepAborted):
        return None


def _raised(text: str) -> str:
    """The exception type a failing rank's text names ("IndexError"), else its first line."""
    found = re.search(r"raised (\w+)", text)
    return found.group(1) if found else (text.splitlines() or ["failed"])[0]


def _rows_cause(world: WorldLike, impl: Implementation, partition: Sequence[Sequence[int]]) -> str:
    """What the rows each member gathered show: the world gathered instead of the group, or the wrong ranks.

    Named only when the whole world gathers these inputs right and some
    member's output is other rows of the inputs than its group's, in order.
    """
    size = world.size
    inputs = [torch.full((2, 3), 100.0 * (r + 1)) + torch.arange(2.0).reshape(-1, 1) for r in range(size)]
    whole: list[Gathered] | None = _attempt(
        lambda: world.run(ranks.forward, impl, inputs, "contiguous", no_grad=False, requires_grad=True)
    )
    if whole is None or any(_row_sources(result.out, inputs) != list(range(size)) for result in whole):
        return ""
    run = _partial(world, ranks.grouped_forward, impl, inputs, partition)
    if run is None:
        return ""
    returned, failures = run
    gathered: dict[int, GroupGathered] = returned
    sources = {r: _row_sources(result.out, inputs) for r, result in gathered.items()}
    group_of = {r: list(members) for members in partition for r in members}
    wrong = {r: s for r, s in sources.items() if s is not None and s != group_of[r]}
    if not wrong and not failures:
        return ""
    if not failures and len(wrong) == size and all(s == list(range(size)) for s in wrong.values()):
        return CAUSES["group_ignored"]
    fits = [name for name, index_of in _MIXUPS.items() if _slot_follows(index_of, sources, failures, partition)]
    if len(fits) == 1:
        return CAUSES[fits[0]]
    if not wrong:
        return ""
    shown = [f"rank {r} of group {group_of[r]} got the rows of ranks {s}" for r, s in sorted(wrong.items())]
    shown += [f"rank {r} raised {_raised(text)}" for r, text in sorted(failures.items())]
    return CAUSES["group_wrong_rows"].format(rows="; ".join(shown))


def _slot_follows(
    index_of: Callable[[int, Sequence[int]], int], sources: dict[int, list[int] | None], failures: dict[int, str],
    partition: Sequence[Sequence[int]],
) -> bool:
    """Whether each member's own rows sit in the slot at ``index_of``'s rank (an IndexError past the group's end).

    The other slots hold their members' rows. True only when some member
    shows it (its computed rank is not its group rank) and none contradicts it.
    """
    witnessed = False
    for members in partition:
        for position, r in enumerate(members):
            index = index_of(r, members)
            if index == position:
                if r in failures or sources.get(r) != list(members):
                    return False
            elif r in failures:
                if "IndexError" not in failures[r] or index < len(members):
                    return False
                witnessed = True
            elif index >= len(members) or sources.get(r) != [r if i == index else m for i, m in enumerate(members)]:
                return False
            else:
                witnessed = True
    return witnessed


def _as_in_the_world(
    world: WorldLike, impl: Implementation, inputs: Sequence[torch.Tensor], partition: Sequence[Sequence[int]],
    shape: tuple[int, ...], cause: str,
) -> str:
    """``cause`` (the whole world's mistake) when every group's gradients show it too; "" otherwise.

    A group of one, where the classic mistakes give the right gradient, must get it.
    """
    if not cause:
        return ""
    run = _group_run(world, impl, inputs, partition)
    if run is None or run[2]:
        return ""
    grads, got, _ = run
    for members in partition:
        rows = [shape[0]] * len(members)
        mine, theirs = [got.get(m) for m in members], [grads[m] for m in members]
        if len(members) == 1:
            if not _grads_correct(mine, expected_grads(theirs, rows)):
                return ""
        elif _formula(mine, theirs, rows) != cause:
            return ""
    return CAUSES["subgroup_as_world"].format(cause=cause)


#: How each rank mix-up computes a member's group rank (its global rank, its group's members).
_MIXUPS: dict[str, Callable[[int, Sequence[int]], int]] = {
    "subgroup_global_rank": lambda r, members: r,
    "subgroup_first_member": lambda r, members: r - members[0],
}


def _group_run(
    world: WorldLike, impl: Implementation, inputs: Sequence[torch.Tensor], partition: Sequence[Sequence[int]],
    *, uneven: bool = False,
) -> tuple[list[torch.Tensor], dict[int, Any], dict[int, str]] | None:
    """Distinct upstream gradients per group (as many rows as its members' inputs), the gradient each rank got
    (gathering with ``uneven=True`` where ``uneven``) and each failing rank's error text."""
    grads: list[torch.Tensor] = [torch.empty(0)] * len(inputs)
    for members in partition:
        rows = sum(inputs[m].shape[0] for m in members)
        per_group = _distinct_grads(len(members), (rows, *inputs[0].shape[1:]), inputs[0].dtype)
        for position, r in enumerate(members):
            grads[r] = per_group[position]
    run = _partial(world, ranks.grouped, impl, inputs, grads, partition, uneven=uneven)
    if run is None:
        return None
    returned, failures = run
    ran: dict[int, BothGathers] = returned
    return grads, {r: result.grad for r, result in ran.items()}, failures


def _follows(
    index_of: Callable[[int, Sequence[int]], int], run: tuple[list[torch.Tensor], dict[int, Any], dict[int, str]],
    partition: Sequence[Sequence[int]], rows: int,
) -> bool | None:
    """Whether every member's gradient is the slice at ``index_of``'s rank (an IndexError past the group's end).

    True when some member shows the mix-up, False when one contradicts it,
    None when every member's computed rank is its group rank (no evidence).
    """
    grads, got, failures = run
    witnessed = None
    for members in partition:
        expected = expected_grads([grads[m] for m in members], [rows] * len(members))
        for position, r in enumerate(members):
            index = index_of(r, members)
            if r in failures and " did not answer within " in failures[r]:
                continue
            if index == position:
                if r in failures or not _close(got.get(r), expected[position]):
                    return False
                continue
            if r in failures:
                if "IndexError" not in failures[r] or index < len(members):
                    return False
            elif not (index < len(members) and _close(got.get(r), expected[index])):
                return False
            witnessed = True
    return witnessed


def _rank_mixup(
    world: WorldLike, impl: Implementation, inputs: Sequence[torch.Tensor], partition: Sequence[Sequence[int]],
    shape: tuple[int, ...],
) -> str:
    """Which rank mix-up the subgroup results show: a ``CAUSES`` key, or "" when they show none.

    "subgroup_global_rank": each member whose global rank is not its group
    rank got the global rank's slice, or an IndexError; "subgroup_first_member":
    the slice at its global rank minus its group's first member's (right for
    contiguous groups only): when both fit (interleaved groups where they
    agree), the groups ``{0}`` and ``{1..W-1}`` tell them apart.
    "subgroup_group_rank": torch refused a rank as "not part of group" (a
    group rank passed where torch wants a global one).
    """
    run = _group_run(world, impl, inputs, partition)
    if run is None:
        return ""
    if run[2] and all("is not part of group" in text for text in run[2].values()):
        return "subgroup_group_rank"
    fits = [name for name, index_of in _MIXUPS.items() if _follows(index_of, run, partition, shape[0])]
    if len(fits) > 1 and world.size > 2:
        contiguous = [[0], list(range(1, world.size))]
        second = _group_run(world, impl, inputs, contiguous)
        if second is None:
            return ""
        fits = [n for n in fits if _follows(_MIXUPS[n], second, contiguous, shape[0]) is not False]
    return fits[0] if len(fits) == 1 else ""
