"""The fsdp2 suite: NeMo AutoModel's FSDP2 path, every ``FSDP2Config`` field proven by behaviour in real worlds.

Importing it registers its checks (:mod:`.checks`, :mod:`.policy_checks`, and :mod:`.config_checks` of
``FSDP2Config`` itself) and its world setup: each
rank shards and steps one tiny model when its world starts
(:func:`.ranks.warm_up`), so torch's first FSDP2 imports (DTensor, sympy:
about a second) are paid in the background rather than inside a check's deadline.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.fsdp2 import checks, config_checks, policy_checks, ranks

__all__ = ["checks", "config_checks", "policy_checks"]

register_suite(Suite("fsdp2", world_setup=ranks.warm_up))
