"""Multi-process test harness for torch.distributed code.

:class:`World` runs a function on every rank of a persistent gloo (or NCCL)
world and returns each rank's result; :class:`RankFailure` and
:class:`WorldTimeout` report ranks that raised, died or hung. The pytest plugin
(:mod:`nemo_dist.testing.plugin`) provides ``dist_world`` / ``world_factory``
fixtures, the ``gpu`` and ``world_sizes`` markers and hypothesis profiles.
Importing this package does not import torch.
"""

from __future__ import annotations

from nemo_dist.testing._errors import (
    FunctionNotPicklable,
    RankFailure,
    WorldError,
    WorldTimeout,
)
from nemo_dist.testing._world import World

__all__ = [
    "FunctionNotPicklable",
    "RankFailure",
    "World",
    "WorldError",
    "WorldTimeout",
]
