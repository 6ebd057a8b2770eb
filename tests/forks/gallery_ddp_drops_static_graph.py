"""Gallery wrapper, broken: takes DDP's keywords through ``**kwargs`` but drops ``static_graph``.

Guarded by ``ddp.static_graph`` (a ``**kwargs`` wrapper gets a model whose
blocks checkpoint themselves, since it takes no ``activation_checkpointing=``):
the DDP inside reports ``static_graph=False`` though the check passed True.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["wrap"]


def wrap(model: nn.Module, **kwargs: Any) -> DistributedDataParallel:
    """``DistributedDataParallel(model, **kwargs)`` without ``static_graph``: the bug."""
    kwargs.pop("static_graph", None)
    return DistributedDataParallel(model, **kwargs)
