"""Gallery wrapper: fairseq's ``DistributedFairseqModel(args, model)``, a proxy holding the DDP at ``.module``.

Pattern (fairseq's distributed model wrapper, re-expressed here): the DDP
settings come from the training ``args`` (here a dict: a Python literal on
the command line), the model is the second parameter, and what comes back
is a proxy module whose ``.module`` is the ``DistributedDataParallel``; any
attribute the proxy lacks is looked up on the DDP, then on the model.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DistributedFairseqModel", "ModuleProxyWrapper"]


class ModuleProxyWrapper(nn.Module):
    """Forwards calls to its ``.module`` and attribute lookups to it, then to its own ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = super().__getattr__("module")
            try:
                return getattr(inner, name)
            except AttributeError:
                return getattr(inner.module, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def DistributedFairseqModel(args: dict[str, Any], model: nn.Module) -> ModuleProxyWrapper:  # the public pattern's name
    """A proxy around a DDP of ``model`` built with the settings of ``args``."""
    ddp = DistributedDataParallel(
        model,
        bucket_cap_mb=args.get("bucket_cap_mb", 25),
        find_unused_parameters=args.get("find_unused_parameters", False),
        gradient_as_bucket_view=args.get("gradient_as_bucket_view", False),
    )
    return ModuleProxyWrapper(ddp)
