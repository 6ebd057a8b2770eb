"""The real_models suite's place in the run, declared to the engine (loaded by file before torch).

Its checks run the ddp component on real transformers architectures: it declares no component and no option of
its own.
"""

from __future__ import annotations

__all__ = ["ORDER"]

#: Where this suite's checks stand in the run (:mod:`nemo_dist.conformance.engine.declarations`).
ORDER = 40
