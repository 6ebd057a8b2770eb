"""Torchrun mode: run the checks inside an existing env:// world, every rank checking.

Under ``torchrun`` each process is a rank. :class:`InWorld` is the
``WorldLike`` the checks get: ``run(fn, ...)`` calls ``fn`` on this rank and
all-gathers every rank's outcome, so every rank sees the same results and
asserts the same way. Hypothesis runs derandomized on every rank, so all
ranks draw the same examples and shrink in lockstep; each call also compares
what the ranks are running and raises :class:`LockstepError` if they diverged.
"""

from __future__ import annotations

import datetime
import os
import pickle
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.profile import hypothesis_settings
from nemo_dist.conformance.engine.registry import Check
from nemo_dist.conformance.engine.runner import run_checks_in, run_worldless
from nemo_dist.conformance.engine.target import COMPONENTS
from nemo_dist.conformance.engine.verdicts import Report, Verdict
from nemo_dist.testing import RankFailure
from nemo_dist.testing.launcher import in_env_world

__all__ = ["InWorld", "LockstepError", "in_torchrun", "init_from_env", "run_in_world"]

class LockstepError(RuntimeError):
    """The ranks stopped running the same thing at the same time (the suite, not the fork, is broken)."""


def in_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment describes an env:// world (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``)."""
    return in_env_world(environ)


def init_from_env(backend: str, timeout_s: float) -> None:
    """Join the env:// world torchrun made (``torch.cuda.set_device(LOCAL_RANK)`` first for nccl)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s)
    )


def _describe(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class InWorld:
    """``WorldLike`` over the already initialised default group of this process."""

    def __init__(self, backend: str) -> None:
        import torch.distributed as dist

        self.size: int = dist.get_world_size()
        self.rank: int = dist.get_rank()
        self.backend: str = backend
        self._calls = 0

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` here, and return every rank's result in rank order.

        Like ``World.run``, ``fn`` gets pickled copies of the arguments and
        results come back by value. If any rank raised, every rank raises a
        ``RankFailure`` naming the failing ranks with their tracebacks.
        Raises :class:`LockstepError` when the ranks are not running the
        same function in the same call.
        """
        self._calls += 1
        name = _describe(fn)
        outcome: tuple[str, Any]
        try:
            fn, args, kwargs = pickle.loads(pickle.dumps((fn, args, kwargs)))
            value = fn(*args, **kwargs)
            outcome = ("returned", pickle.dumps(value))
        except Exception as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            text = f"rank {self.rank} raised {type(exc).__qualname__}: {exc}\n{tb}"
            outcome = ("raised", text)
        gathered = self.all_gather((self._calls, name, outcome))
        seen = {(calls, fn_name) for calls, fn_name, _ in gathered}
        if len(seen) > 1:
            listing = "; ".join(
                f"rank {r}: call {calls} {fn_name}"
                for r, (calls, fn_name, _) in enumerate(gathered)
            )
            raise LockstepError(f"ranks diverged: {listing}")
        failures = {
            r: body for r, (_, _, (kind, body)) in enumerate(gathered) if kind == "raised"
        }
        returned = {
            r: pickle.loads(body)
            for r, (_, _, (kind, body)) in enumerate(gathered)
            if kind == "returned"
        }
        if failures:
            raise RankFailure(failures, returned, self.size, f" running {name}")
        return [returned[r] for r in range(self.size)]


def run_in_world(
    checks: Sequence[Check],
    impl: Implementation,
    *,
    backend: str,
    tier: str,
    max_examples: int | None,
    on_verdict: Callable[[Verdict], None] | None = None,
    components: Sequence[str] = COMPONENTS,
    hypothesis_db: Path | None = None,
) -> Report:
    """Run ``checks`` in this process's existing world on every rank; return the report.

    Every rank must call it with the same arguments (checked: the ranks
    compare the check names first, and raise :class:`LockstepError` if they
    differ). Checks that need no process group run once (and skip: this
    process has one); checks whose world-size range excludes this world are
    not applicable. Hypothesis runs derandomized, so with no example
    database; its caches go under ``hypothesis_db`` (None: a temporary directory).
    """
    import time

    world = InWorld(backend)
    names = [c.name for c in checks]
    plans = world.all_gather((names, impl, max_examples))
    if any(plan != plans[0] for plan in plans):
        raise LockstepError(
            "ranks were asked to run different checks: "
            + "; ".join(f"rank {r}: {p!r}" for r, p in enumerate(plans))
        )
    start = time.perf_counter()
    verdicts: list[Verdict] = []
    notes = [f"torchrun world of {world.size} ranks; rank 0 reports"]
    with hypothesis_settings(max_examples, derandomize=True, database=hypothesis_db):
        run_worldless(checks, impl, verdicts, on_verdict)
        run_checks_in(checks, world, impl, verdicts, on_verdict, notes=notes)
    return Report(
        tuple(verdicts),
        impl,
        backend,
        tier,
        max_examples,
        time.perf_counter() - start,
        tuple(notes),
        tuple(components),
    )
