"""The moe suite: expert parallelism for a mixture-of-experts layer judged against one process, in real worlds.

Importing it registers its checks (:mod:`.checks`) and its per-world step
that notes the expert placements. Its options and its component ``moe`` are
declared in :mod:`.options`, read by the engine without importing this
package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.moe import checks

__all__ = ["checks"]

register_suite(Suite("moe", prepare=checks.prepare))
