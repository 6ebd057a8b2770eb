"""The ddp suite: both DDP entry points and every ``DDPConfig`` field, proven by behaviour in real worlds.

Importing it registers its checks (:mod:`.checks`, :mod:`.discovery`) and its world setup: each
rank builds and trains one tiny DDP when its world starts, so torch's first-DDP
imports are paid in the background rather than inside a check's deadline.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.ddp import checks, discovery, ranks

__all__ = ["checks", "discovery"]

register_suite(Suite("ddp", world_setup=ranks.warm_up))
