"""Gallery wrapper: a strategy built from its devices and a cluster environment, as Lightning Fabric's is.

Pattern (Lightning Fabric's ``DDPStrategy(parallel_devices=..., cluster_environment=...).setup_module(model)``,
re-expressed here): the strategy holds every rank's device and an environment object that
tells this process its local rank; ``setup_module`` moves the model to its device and wraps it
in DDP. Without devices it asserts, as the original does, so a run that gives none cannot start.
Checked with ``--ddp-kwarg parallel_devices=@devices`` and ``--ddp-kwarg
cluster_environment=tests.forks.gallery_ddp_device_strategy:LocalEnvironment()``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPStrategy", "LocalEnvironment"]


class LocalEnvironment:
    """The launcher's view of this process: its local rank, read from ``LOCAL_RANK`` as torchrun sets it."""

    def local_rank(self) -> int:
        """This process's rank on its node."""
        return int(os.environ.get("LOCAL_RANK", "0"))


class DDPStrategy:
    """Keeps the devices, the environment and DDP's keywords; ``setup_module`` wraps a model with them."""

    def __init__(
        self,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: LocalEnvironment | None = None,
        **kwargs: Any,
    ) -> None:
        self.parallel_devices = parallel_devices
        self.cluster_environment = cluster_environment
        self._ddp_kwargs = kwargs

    def setup_module(self, module: nn.Module) -> DistributedDataParallel:
        """The model on this rank's device, in ``DistributedDataParallel`` with the kept keywords."""
        assert self.parallel_devices is not None
        assert self.cluster_environment is not None
        device = self.parallel_devices[self.cluster_environment.local_rank()]
        device_ids = None if device.type == "cpu" else [device.index]
        return DistributedDataParallel(module.to(device), device_ids=device_ids, **self._ddp_kwargs)
