"""Per-step deadlines that adapt to the run, so a hang costs seconds, not minutes.

A healthy conformance step (one ``world.run``) takes milliseconds. A
:class:`DeadlineWorld` gives each step a deadline of ``FACTOR`` times the
slowest step that passed within its deadline so far in the run, never less
than the floor (``FLOOR_S``, ``--min-deadline``) and never more than the cap
(``--timeout``). A step is slow rather than stuck while one of its unfinished
ranks is still working (importing, compiling bytecode, computing: see
:mod:`nemo_dist.testing.progress`); it then gets time up to the cap, and its
time is not taken as the measure of a step. A step whose unfinished ranks are
all blocked past its deadline (or that is still running at the cap) raises
:class:`StepHung`, a ``BaseException``: hypothesis does not catch it,
so a hung example is reported at once instead of being re-run (each re-run
would wait the deadline again) while shrinking. Likewise a step whose
failure left ranks stuck or dead raises :class:`StepBroke` (each re-run
would cost the other ranks' grace period and a new world). The world
replaces its ranks, so the next check gets healthy ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.testing import RankFailure, WorldTimeout

__all__ = [
    "FACTOR",
    "FLOOR_S",
    "DeadlineWorld",
    "Deadlines",
    "StepAborted",
    "StepBroke",
    "StepHung",
    "condensed_stacks",
    "describe_call",
    "left_ranks_broken",
    "warm_up",
]

#: A step may take this many times the slowest passing step so far...
FACTOR = 10.0
#: ...but always at least this many seconds (``--min-deadline``).
FLOOR_S = 10.0

_SHOWN_ELEMENTS = 24
_SHOWN_CHARS = 600


class Deadlines:
    """The slowest passing step of a run and the deadline it implies (shared by the run's worlds)."""

    def __init__(self, cap_s: float, floor_s: float = FLOOR_S, factor: float = FACTOR) -> None:
        self.cap_s = float(cap_s)
        self.floor_s = min(float(floor_s), self.cap_s)
        self.factor = float(factor)
        self.slowest_s = 0.0

    def current(self) -> float:
        """The deadline of the next step, in seconds."""
        return min(self.cap_s, max(self.floor_s, self.factor * self.slowest_s))

    def passed(self, seconds: float) -> None:
        """Record a step that passed in ``seconds``."""
        self.slowest_s = max(self.slowest_s, seconds)

    def explain(self, deadline_s: float) -> str:
        """How ``deadline_s`` came about, for a HANG verdict."""
        return (
            f"deadline {deadline_s:g} s: {self.factor:g} x the slowest passing step so far "
            f"({self.slowest_s:.3f} s), at least {self.floor_s:g} s, at most --timeout {self.cap_s:g} s"
        )


_FRAMES_SHOWN = 8


def _main_thread(stack: str) -> str:
    """The thread of a faulthandler dump that serves the harness's calls, its innermost frames first."""
    blocks = [b for b in stack.split("\n\n") if b.strip()]
    threads = [b for b in blocks if "most recent call first" in b]
    serving = [b for b in threads if "nemo_dist/testing/_rank.py" in b] or threads or blocks
    lines = serving[0].strip().splitlines()
    frames = [line for line in lines[1:] if line.strip().startswith("File")]
    shown = frames[:_FRAMES_SHOWN]
    more = f"\n    ... ({len(frames) - len(shown)} outer frames)" if len(frames) > len(shown) else ""
    return "\n".join(f"    {line.strip()}" for line in shown) + more if frames else stack.strip()


def condensed_stacks(timeout: WorldTimeout) -> str:
    """One block per unfinished rank: where its serving thread was when the deadline passed."""
    return "\n".join(f"rank {rank} was at:\n{_main_thread(stack)}" for rank, stack in timeout.stacks.items())


class StepAborted(BaseException):
    """A step whose failure must not be re-run while hypothesis shrinks; ``call`` is the step."""

    def __init__(self, text: str, call: str) -> None:
        super().__init__(text)
        self.call = call


class StepHung(StepAborted):
    """A step passed its deadline: the world's timeout report, the call and how the deadline was set.

    Its text names the unfinished ranks and where each one was (innermost
    frames of the thread serving the call); ``timeout`` keeps the full dumps.
    """

    def __init__(self, timeout: WorldTimeout, call: str, deadline_note: str) -> None:
        ranks = ", ".join(str(r) for r in timeout.stacks)
        super().__init__(f"rank {ranks} of {timeout.world_size} did not finish\n{condensed_stacks(timeout)}", call)
        self.timeout = timeout
        self.deadline_note = deadline_note


class StepBroke(StepAborted):
    """A step failed in a way that left ranks stuck or dead (the world was replaced): ``failure`` says how.

    Re-running such a step costs seconds (the other ranks' grace, a new
    world), so it is reported as it is rather than shrunk.
    """

    def __init__(self, failure: RankFailure, call: str) -> None:
        super().__init__(str(failure), call)
        self.failure = failure


def left_ranks_broken(failure: RankFailure) -> bool:
    """Whether a rank of ``failure`` died or never answered (so the world had to be replaced)."""
    return any(" did not answer within " in text or " died: " in text for text in failure.failures.values())


def _show(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        head = f"tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')}"
        if value.numel() <= _SHOWN_ELEMENTS:
            return f"{head}, values={value.flatten().tolist()})"
        return f"{head})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_show(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def describe_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """``module.function(arg, ..., key=value)`` with small tensors shown whole (the Implementation left out)."""
    shown = [_show(a) for a in args if not isinstance(a, Implementation)]
    shown += [f"{k}={_show(v)}" for k, v in kwargs.items()]
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return f"{name}({', '.join(shown)})"


class DeadlineWorld:
    """A ``WorldLike`` over a :class:`~nemo_dist.testing.World` whose steps have adaptive deadlines."""

    def __init__(self, world: Any, deadlines: Deadlines) -> None:
        self._world = world
        self.deadlines = deadlines

    @property
    def size(self) -> int:
        """Number of ranks."""
        return int(self._world.size)

    @property
    def backend(self) -> str:
        """The world's backend."""
        return str(self._world.backend)

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn`` on every rank; raise :class:`StepHung` when its ranks are stuck past the current deadline.

        Past the deadline a step whose unfinished ranks are still working
        (importing, compiling, computing on a busy machine) gets more time, up
        to the cap; it is hung once every unfinished rank is blocked (waiting
        in a collective or a receive with an unchanged stack), or at the cap.
        """
        deadline = self.deadlines.current()
        start = time.perf_counter()
        try:
            patient = getattr(self._world, "run_patiently", None)
            if callable(patient):
                results: list[Any] = patient(deadline, self.deadlines.cap_s, fn, *args, **kwargs)
            else:
                results = self._world.run_with_deadline(deadline, fn, *args, **kwargs)
        except WorldTimeout as exc:
            note = self.deadlines.explain(deadline)
            if getattr(exc, "reason", ""):
                note = f"{note}; {exc.reason}"
            raise StepHung(exc, describe_call(fn, args, kwargs), note) from None
        except RankFailure as exc:
            if left_ranks_broken(exc):
                raise StepBroke(exc, describe_call(fn, args, kwargs)) from None
            raise
        elapsed = time.perf_counter() - start
        if elapsed <= deadline:  # a step let run past its deadline because it was working says nothing of the next
            self.deadlines.passed(elapsed)
        return results

    def warm_up(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn`` with the cap as deadline, not counted as a step (first imports, model building)."""
        try:
            results: list[Any] = self._world.run_with_deadline(self.deadlines.cap_s, fn, *args, **kwargs)
        except WorldTimeout as exc:
            note = f"deadline {self.deadlines.cap_s:g} s (--timeout)"
            raise StepHung(exc, describe_call(fn, args, kwargs), note) from None
        return results


def warm_up(world: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
    """Run a warm-up step (imports, building caches) through ``world.warm_up`` when it has one, else ``world.run``."""
    runner = getattr(world, "warm_up", None)
    if callable(runner):
        return list(runner(fn, *args, **kwargs))
    return list(world.run(fn, *args, **kwargs))
