"""Gallery wrapper: torch's composable ``replicate(model)`` applied in place, returning None.

Pattern (torchtitan's ``apply_ddp``, re-expressed here): the model is
changed in place by ``torch.distributed._composable.replicate`` (with a
bucket cap of 100 MiB, no other DDP keyword) and nothing is returned; the DDP lives in the
module's composable state and runs through its forward hooks, built at the
first forward. Offers ``set_requires_gradient_sync`` instead of ``no_sync``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable.replicate import replicate

__all__ = ["apply_ddp"]


def apply_ddp(model: nn.Module) -> None:
    """Replicate ``model`` in place, with 100 MiB buckets."""
    replicate(model, bucket_cap_mb=100)
