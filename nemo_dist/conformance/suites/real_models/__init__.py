"""The real-models suite: activation checkpointing on tiny real ``transformers`` classes (component ddp).

Importing it registers its checks (:mod:`.checks`). ``transformers`` is a
test target, imported only on the ranks (and checked for in the parent).
"""

from __future__ import annotations

from nemo_dist.conformance.suites.real_models import checks

__all__ = ["checks"]
