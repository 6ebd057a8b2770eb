"""The tp suite: any tensor-parallel plan judged by behaviour against the unsharded model, in real worlds.

Importing it registers its checks (:mod:`.checks`, :mod:`.mesh_checks`) and
its world setup (each rank imports torch's tensor parallelism when its world
starts, :func:`.ranks.warm_up`). Its options and its component ``tp`` are
declared in :mod:`.options`, read by the engine without importing this package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.tp import checks, mesh_checks, ranks

__all__ = ["checks", "mesh_checks"]

register_suite(Suite("tp", world_setup=ranks.warm_up))
