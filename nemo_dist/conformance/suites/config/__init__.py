"""The config suite: ``DDPConfig``'s defaults, scope validation and normalisation (no process group needed).

Importing it registers its checks (:mod:`.checks`).
"""

from __future__ import annotations

from nemo_dist.conformance.suites.config import checks

__all__ = ["checks"]
