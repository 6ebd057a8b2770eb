"""The pp suite: any pipeline-parallel split and schedule judged by behaviour against one process, in real worlds.

Importing it registers its checks (:mod:`.checks`). Its options and its
component ``pp`` are declared in :mod:`.options`, read by the engine without
importing this package.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.pp import (
    accumulation_check,
    checks,
    data_parallel_check,
    keyword_check,
    virtual_check,
)

__all__ = ["accumulation_check", "checks", "data_parallel_check", "keyword_check", "virtual_check"]

register_suite(Suite("pp"))
