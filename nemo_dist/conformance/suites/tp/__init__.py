"""The tp suite: any tensor-parallel plan judged by behaviour against the unsharded model, in real worlds.

Importing it registers its checks (:mod:`.checks`, :mod:`.mesh_checks`). It
has no world setup: torch's tensor parallelism is imported by the fork
server, and a sharded model's first steps (DTensor filling its sharding
caches) cost the first check less than a warm-up on a model of its own cost
every rank. Its options and its component ``tp`` are declared in
:mod:`.options`, read by the engine without importing this package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.tp import checks, mesh_checks

__all__ = ["checks", "mesh_checks"]

register_suite(Suite("tp"))
