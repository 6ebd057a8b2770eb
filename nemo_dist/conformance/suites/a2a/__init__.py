"""The a2a suite: any autograd all-to-all judged by its routing and its gradient rule, in real worlds.

Importing it registers its checks (:mod:`.checks`). Its options and its
component ``a2a`` are declared in :mod:`.options`, read by the engine without
importing this package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.a2a import checks

__all__ = ["checks"]

register_suite(Suite("a2a"))
