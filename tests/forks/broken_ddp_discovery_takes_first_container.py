"""Broken DDP fork (test fixture): structural discovery takes each group's first container, not its longest.

Guarded by ``ddp.checkpointing_follows_structural_discovery``: a one-block ``language_model.adapters`` comes
before the three-block ``language_model.layers``, which is the language group (upstream keeps the longest).
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["DDPManager"]


def _first_containers(model: nn.Module) -> dict[str, list[str]]:
    """Per group, the path of the first non-empty ModuleList found (the deliberate bug: not the longest)."""
    first: dict[str, list[str]] = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            words = set(path.lower().split("."))
            group = "audio" if "audio_tower" in words else "vision" if "visual" in words else "language"
            first.setdefault(group, [path])
    return first


def _manager() -> type:
    from nemo_dist.distributed.ddp import DDPManager as _ReferenceManager
    from nemo_dist.distributed.ddp import parallelize_ddp

    class DDPManager(_ReferenceManager):
        """The reference manager, except that a model without a layout is given each group's first container."""

        def parallelize(self, model: Any) -> Any:
            """Declare the first containers as the model's layer groups, then wrap as the reference does."""
            if getattr(model, "parallel_layer_groups", None) is None:
                model.parallel_layer_groups = _first_containers(model)
            return parallelize_ddp(model, self.config, device=self.device)

    return DDPManager


DDPManager = _manager()
