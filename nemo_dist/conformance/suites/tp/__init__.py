"""The tp suite: any tensor-parallel plan judged by behaviour against the unsharded model, in real worlds.

Importing it registers its checks (:mod:`.checks`, :mod:`.mesh_checks`). It
has no world setup: the fork server imports torch's tensor parallelism, and
the first check pays for DTensor filling its sharding caches, which costs
less than the warm-up on a model of the suite's own that every rank once ran.
Its options and its component ``tp`` are declared in :mod:`.options`, read by
the engine without importing this package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.tp import checks, mesh_checks

__all__ = ["checks", "mesh_checks"]

register_suite(Suite("tp"))
