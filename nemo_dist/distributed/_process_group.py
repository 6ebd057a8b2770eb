"""The check every entry point of the components makes first: torch.distributed has a default process group."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["require_default_group"]


def require_default_group(who: str) -> None:
    """Raise ``RuntimeError`` naming ``who`` ("nemo_dist DDP") unless the default process group is initialised."""
    if not dist.is_available():
        raise RuntimeError(f"{who}: torch.distributed is not available in this build of torch")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{who}: the default process group is not initialized; "
            "call torch.distributed.init_process_group() first (torchrun sets up its environment)"
        )
