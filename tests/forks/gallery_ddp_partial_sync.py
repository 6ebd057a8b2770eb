"""Gallery wrappers, broken: hand-written data parallels that sync only some parameters.

Bug: the gradient hooks go on a subset of the parameters: ``LinearOnly``
only on those of ``nn.Linear`` layers (norms, embeddings and the root's own
parameters train locally), ``RootOnly`` only on the root module's own
(``parameters(recurse=False)``). On a flat ``Linear`` both look correct.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from tests.forks.gallery_ddp_hand_written import DataParallel as _DataParallel

__all__ = ["LinearOnly", "RootOnly"]


class _Partial(_DataParallel):
    """The hand-written one, hooking only :meth:`synced` parameters."""

    def __init__(self, module: nn.Module) -> None:
        nn.Module.__init__(self)
        self.module = module
        self.syncing = True
        self.start()
        for p in self.synced(module):
            p.register_post_accumulate_grad_hook(self._hook)

    def synced(self, module: nn.Module) -> Iterable[torch.Tensor]:
        """The parameters whose gradients are averaged."""
        raise NotImplementedError


class LinearOnly(_Partial):
    """BUG: only ``nn.Linear`` layers' parameters are averaged."""

    def synced(self, module: nn.Module) -> Iterable[torch.Tensor]:
        """Parameters of the ``nn.Linear`` sub-modules (the module itself included when it is one)."""
        return [p for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False)]


class RootOnly(_Partial):
    """BUG: only the root module's own parameters are averaged."""

    def synced(self, module: nn.Module) -> Iterable[torch.Tensor]:
        """``module.parameters(recurse=False)``."""
        return list(module.parameters(recurse=False))
