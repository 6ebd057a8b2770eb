"""Errors a :class:`~nemo_dist.testing.World` raises in the parent process."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["FunctionNotPicklable", "RankFailure", "WorldError", "WorldTimeout"]


class WorldError(Exception):
    """Base class of every failure a World reports about its ranks."""


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class RankFailure(WorldError):
    """One or more ranks raised or died while running a function.

    ``failures`` maps each failing rank to a text that starts with
    ``"rank R raised Type: message"`` (with the rank's full traceback),
    ``"rank R died: exit code N"`` / ``"rank R died: killed by signal SIGNAME"``
    (with the tail of its stderr), or ``"rank R did not answer ..."`` (with its
    stack). ``returned`` maps the ranks that returned normally to their values.
    """

    def __init__(
        self,
        failures: dict[int, str],
        returned: dict[int, Any] | None = None,
        world_size: int | None = None,
        context: str = "",
    ) -> None:
        self.failures = dict(sorted(failures.items()))
        self.returned = dict(returned or {})
        self.world_size = world_size
        self.context = context
        size = f" of {world_size}" if world_size is not None else ""
        summary = "".join(
            f"\n  {text.splitlines()[0] if text else f'rank {rank} failed'}" for rank, text in self.failures.items()
        )
        head = f"{len(self.failures)}{size} rank(s) failed{context}:{summary}"
        body = "\n\n".join(text.rstrip() for text in self.failures.values())
        super().__init__(f"{head}\n\n{body}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.failures, self.returned, self.world_size, self.context),
        )


class WorldTimeout(WorldError, TimeoutError):
    """Some ranks did not finish before the deadline.

    ``stacks`` maps every rank that had not finished to the faulthandler dump
    of all its threads, taken when the deadline passed. The World that raised
    it has been replaced: the next run starts fresh ranks.
    """

    def __init__(
        self,
        deadline_s: float,
        stacks: dict[int, str],
        world_size: int | None = None,
        context: str = "",
        reason: str = "",
    ) -> None:
        self.deadline_s = deadline_s
        self.stacks = dict(sorted(stacks.items()))
        self.world_size = world_size
        self.context = context
        self.reason = reason
        size = f" of {world_size}" if world_size is not None else ""
        why = f" ({reason})" if reason else ""
        head = (
            f"rank {_ranks_text(list(self.stacks))}{size} did not finish within "
            f"{deadline_s:g} s{context}{why}; stacks of the unfinished ranks follow"
        )
        body = "\n\n".join(f"--- rank {rank} stack ---\n{text.rstrip()}" for rank, text in self.stacks.items())
        super().__init__(f"{head}\n\n{body}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.deadline_s, self.stacks, self.world_size, self.context, self.reason),
        )


class FunctionNotPicklable(pickle.PicklingError, TypeError):
    """The function or its arguments cannot be sent to the rank processes.

    Raised in the parent before anything is sent; the World stays healthy.
    """
