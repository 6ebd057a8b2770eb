"""Gallery wrapper: ColossalAI's ``TorchDDPPlugin(...).configure(model, ...)``, returning a tuple.

Pattern (ColossalAI's booster plugin, re-expressed here): a plugin built
with DDP's settings by name, whose ``configure`` takes the model (and the
optimizer, criterion, dataloader and scheduler, all optional) and returns
them as a tuple, the model first, wrapped in a ``ModelWrapper`` holding the
``DistributedDataParallel`` at ``.module``. Pick the model with ``--ddp-output 0``.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["TorchDDPModel", "TorchDDPPlugin"]


class TorchDDPModel(nn.Module):
    """The model wrapper: ``.module`` is a DDP of the model; ``unwrap()`` gives the model back."""

    def __init__(self, module: nn.Module, **ddp_kwargs: Any) -> None:
        super().__init__()
        self.module = DistributedDataParallel(module, **ddp_kwargs)

    def unwrap(self) -> nn.Module:
        """The model inside."""
        return self.module.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class TorchDDPPlugin:
    """DDP's settings by name; ``configure`` wraps the model with them."""

    def __init__(
        self,
        broadcast_buffers: bool = True,
        bucket_cap_mb: int = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
    ) -> None:
        self.ddp_kwargs = {
            "broadcast_buffers": broadcast_buffers,
            "bucket_cap_mb": bucket_cap_mb,
            "find_unused_parameters": find_unused_parameters,
            "check_reduction": check_reduction,
            "gradient_as_bucket_view": gradient_as_bucket_view,
            "static_graph": static_graph,
        }

    def configure(
        self,
        model: nn.Module,
        optimizer: Any = None,
        criterion: Any = None,
        dataloader: Any = None,
        lr_scheduler: Any = None,
    ) -> tuple[TorchDDPModel, Any, Any, Any, Any]:
        """``(wrapped model, optimizer, criterion, dataloader, lr_scheduler)``."""
        return TorchDDPModel(model, **self.ddp_kwargs), optimizer, criterion, dataloader, lr_scheduler
