"""Broken fork of ``nemo_dist.distributed.all_to_all``: ``dispatch_tokens`` clamps destinations into the group
instead of refusing them, so a token addressed outside the group silently goes to the last rank.

Guard: a2a.bad_destinations_refused_on_every_rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.distributed import all_to_all as bundled
from nemo_dist.distributed.all_to_all import TokenRoute, all_to_all_with_grad, combine_tokens

__all__ = ["TokenRoute", "all_to_all_with_grad", "combine_tokens", "dispatch_tokens"]


def dispatch_tokens(
    tokens: torch.Tensor, destinations: torch.Tensor, group: Any = None
) -> tuple[torch.Tensor, TokenRoute]:
    """The bundled dispatch of destinations clamped to ``[0, group size)``."""
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    return bundled.dispatch_tokens(tokens, destinations.clamp(0, size - 1), group)
