"""Stages where the schedule runs them: read before any step, so a misplaced stage is a failure, never a crash.

A torch stage sends its activations to the rank its stage map
(``stage_index_to_group_rank``, which a multi-stage schedule sets on each of
its stages) says holds the next stage. A stage held elsewhere makes ranks
exchange with the wrong peer: measured on gloo, a ZBVZeroBubble pipeline
whose stages are placed round robin makes rank 1 try to allocate 94 TB from
garbage shape metadata and abort, and rank 0 lose its connection. So every
pp run gathers, right after building, which rank holds each stage and what
every stage map says (:func:`misplacement`, one collective on every rank of
the pipeline), and steps nothing where they disagree; the checks then fail
with what is wrong (:func:`fail_if_misplaced`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from nemo_dist.conformance.engine.registry import failure
from nemo_dist.conformance.suites.pp.messages import Misplacement

__all__ = ["fail_if_misplaced", "misplacement", "style_cause"]

#: The likely cause of stages placed in one style where the stage maps run the other.
_STYLES = {
    ("loop", "v"): "the stages are placed round robin (rank r holds stages r, r + pp, ...) where the schedule runs "
                   "them in a V (rank r runs stages r and 2 * pp - 1 - r: ZBVZeroBubble, DualPipeV)",
    ("v", "loop"): "the stages are placed in a V (rank r holds stages r and 2 * pp - 1 - r) where the schedule runs "
                   "them round robin (rank r runs stages r, r + pp, ...: Interleaved1F1B, LoopedBFS and the other "
                   "multi-stage schedules)",
}


def _layout(style: str, size: int, per_rank: int) -> dict[int, int] | None:
    """Stage -> rank of ``size`` ranks holding ``per_rank`` stages each in ``style`` (a V holds two)."""
    if style == "v":
        return None if per_rank != 2 else {**{r: r for r in range(size)}, **{2 * size - 1 - r: r for r in range(size)}}
    return {r + size * i: r for r in range(size) for i in range(per_rank)}


def misplacement(stages: Sequence[Any], group: Any = None) -> Misplacement | None:
    """Gather over ``group`` (every rank of this pipeline; default the world) each rank's stage indices, stage
    counts and stage maps: None where every stage is held once, by the rank every stage map names, and every
    stage agrees on the count; else what differs (the same on every rank)."""
    mine = [(int(s.stage_index), int(getattr(s, "num_stages", 0)), dict(getattr(s, "stage_index_to_group_rank", {})))
            for s in stages]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    held: dict[int, list[int]] = {}
    for rank, entries in enumerate(gathered):
        for index, _, _ in entries:
            held.setdefault(index, []).append(rank)
    totals = sorted({total for entries in gathered for _, total, _ in entries})
    if len(totals) != 1:
        return Misplacement(f"the stages disagree on how many stages the pipeline has: {totals}")
    lines = [f"no rank holds stage {index}" for index in range(totals[0]) if index not in held]
    lines += [f"stage {index} is held by ranks {', '.join(map(str, ranks))}" for index, ranks in sorted(held.items())
              if len(ranks) > 1]
    mapped: dict[int, set[int]] = {}
    for entries in gathered:
        for _, _, stage_map in entries:
            for index, rank in stage_map.items():
                mapped.setdefault(int(index), set()).add(int(rank))
    lines += [f"stage {index} is held by rank {', '.join(map(str, held[index]))}, and the stage maps run it on rank "
              f"{', '.join(map(str, sorted(ranks)))}" for index, ranks in sorted(mapped.items())
              if index in held and set(held[index]) != ranks]
    if not lines:
        return None
    return Misplacement("; ".join(lines), style_cause(held, mapped, len(gathered)))


def style_cause(held: dict[int, list[int]], mapped: dict[int, set[int]], size: int) -> str | None:
    """The style cause where the stages are held exactly in one style and every stage map runs exactly the other."""
    per_rank = len(held) // size if size else 0
    placed = {index: ranks[0] for index, ranks in held.items() if len(ranks) == 1}
    runs = {index: next(iter(ranks)) for index, ranks in mapped.items() if len(ranks) == 1}
    for (mine, theirs), cause in _STYLES.items():
        if placed == _layout(mine, size, per_rank) and runs == _layout(theirs, size, per_rank):
            return cause
    return None


def fail_if_misplaced(where: str, reports: Sequence[Any]) -> None:
    """Raise the failure of a pipeline whose ranks found its stages misplaced (a report's ``misplaced``): what is
    wrong, and the cause where the layout proves one."""
    found = next((report.misplaced for report in reports if getattr(report, "misplaced", None) is not None), None)
    if found is None:
        return
    message = f"{where}: the stages are not where the schedule runs them, so nothing was stepped: {found.what}"
    raise failure(message, found.cause) if found.cause else AssertionError(message)
