"""The wrapper suite's place in the run, declared to the engine (loaded by file before torch).

Its checks are the ddp component's companion: they run while a ``--ddp-fn`` wrapper is named, and the ddp
suite's options name it (:mod:`nemo_dist.conformance.suites.ddp.options`).
"""

from __future__ import annotations

__all__ = ["ORDER"]

#: Where this suite's checks stand in the run (:mod:`nemo_dist.conformance.engine.declarations`).
ORDER = 50
