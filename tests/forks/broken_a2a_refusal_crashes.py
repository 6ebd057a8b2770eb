"""Broken fork of ``nemo_dist.distributed.all_to_all``: its refusal of split sizes that disagree builds its message
by adding a list to a string, so every rank raises ``TypeError`` from the fork's own code instead of the refusal.

Guard: a2a.mismatched_sizes_refused_on_every_rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_dist.distributed import all_to_all as bundled
from nemo_dist.distributed.all_to_all import TokenRoute, combine_tokens, dispatch_tokens

__all__ = ["TokenRoute", "all_to_all_with_grad", "combine_tokens", "dispatch_tokens"]


def all_to_all_with_grad(
    tensor: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
) -> torch.Tensor:
    """The bundled all-to-all, its refusal's message built from the list of problems."""
    try:
        return bundled.all_to_all_with_grad(tensor, output_split_sizes, input_split_sizes, group)
    except ValueError as error:
        problems = str(error).split(": ", 1)[-1].split("; ")
        raise ValueError("all_to_all_with_grad: split sizes do not agree: " + problems) from None  # type: ignore[operator]
