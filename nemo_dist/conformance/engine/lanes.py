"""Worlds of different sizes checked side by side, their verdicts reported in world order.

A world of one rank keeps one core busy; a world of four keeps two busy and
waits on the others. Checking the worlds of a run one after another leaves
cores idle, so on gloo the runner deals the world sizes into lanes (the
largest first, each to the lane with the fewest ranks so far) and runs each
lane in a thread of its own, one world after another. Every verdict still
comes out in the order a single lane gives: :class:`InOrder` passes on the
verdicts of the first unfinished world as they come and holds back those of
later worlds until every earlier one is done.

The threads share the process: warnings are filed per thread
(:mod:`~nemo_dist.conformance.engine.thread_warnings`), hypothesis keeps its state
per thread, and each World is used by one thread only. The fork server of
the ranks must outlive every lane, and a process started by a thread dies
when that thread ends (``PR_SET_PDEATHSIG``), so the caller starts the first
world of each lane before the lanes start, and every lane thread waits for
the others before it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from nemo_dist.conformance.engine.thread_warnings import ThreadWarnings
from nemo_dist.conformance.engine.verdicts import Verdict

__all__ = ["InOrder", "deal", "run_lanes"]

#: Lanes of a gloo run on a machine with at least two cores.
MAX_LANES = 2


def deal(sizes: Sequence[int], lanes: int) -> list[list[int]]:
    """The indices of ``sizes`` dealt into at most ``lanes`` lanes, each lane's worlds largest first.

    Largest first, each world goes to the lane with the fewest ranks so far
    (the first such lane on a tie); empty lanes are left out.
    """
    dealt: list[list[int]] = [[] for _ in range(max(1, lanes))]
    load = [0] * len(dealt)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lane = load.index(min(load))
        dealt[lane].append(index)
        load[lane] += sizes[index]
    return [lane for lane in dealt if lane]


class InOrder:
    """Passes verdicts on in world order: the first unfinished world's at once, later worlds' once it is done."""

    def __init__(self, worlds: int, on_verdict: Callable[[Verdict], None] | None) -> None:
        self._lock = threading.Lock()
        self._on_verdict = on_verdict
        self._held: list[list[Verdict]] = [[] for _ in range(worlds)]
        self._done = [False] * worlds
        self._head = 0

    def callback(self, world: int) -> Callable[[Verdict], None]:
        """The ``on_verdict`` of world number ``world``."""

        def record(verdict: Verdict) -> None:
            with self._lock:
                if world == self._head:
                    self._emit([verdict])
                else:
                    self._held[world].append(verdict)

        return record

    def done(self, world: int) -> None:
        """World number ``world`` has no more verdicts: pass on what the next worlds hold."""
        with self._lock:
            self._done[world] = True
            while self._head < len(self._done) and self._done[self._head]:
                self._head += 1
                if self._head < len(self._held):
                    self._emit(self._held[self._head])
                    self._held[self._head] = []

    def _emit(self, verdicts: list[Verdict]) -> None:
        if self._on_verdict is not None:
            for verdict in verdicts:
                self._on_verdict(verdict)


def run_lanes(
    lanes: list[list[int]],
    run_world: Callable[[int, Callable[[Verdict], None]], None],
    on_verdict: Callable[[Verdict], None] | None,
    worlds: int,
) -> None:
    """Run ``run_world(index, on_verdict)`` for every world index of ``lanes``, one thread per lane.

    Each lane runs its worlds in order; ``on_verdict`` sees every verdict in
    world order (:class:`InOrder`). Warnings are filed per thread while the
    lanes run. The first exception a lane raised is raised here once every
    lane has ended (a lane stops at its first exception).
    """
    order = InOrder(worlds, on_verdict)
    errors: list[BaseException] = []
    finished = threading.Barrier(len(lanes))

    def lane(indices: list[int]) -> None:
        try:
            for index in indices:
                run_world(index, order.callback(index))
                order.done(index)
        except BaseException as exc:  # re-raised by the caller's thread
            errors.append(exc)
        finally:
            # A fork server started from this thread dies with it: wait for every lane.
            finished.wait()

    with ThreadWarnings():
        threads = [threading.Thread(target=lane, args=(indices,), name=f"lane-{n}") for n, indices in enumerate(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
