"""Which implementation a check runs against: module paths, imported in each rank."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType

__all__ = ["PRESETS", "REFERENCE", "Implementation", "NotSupported"]


class NotSupported(Exception):
    """The implementation lacks a feature a check needs (an extended-tier keyword, say)."""


@dataclass(frozen=True)
class Implementation:
    """Module paths of the three components; ``None`` means "not checked".

    Only the paths travel to the ranks (the object pickles as three strings);
    each rank imports the modules itself.
    """

    gather: str | None = "nemo_dist.loss.dist_utils"
    ddp: str | None = "nemo_dist.distributed.ddp"
    config: str | None = "nemo_dist.distributed.config"

    def module(self, component: str) -> ModuleType:
        """Import and return the module of ``component`` ("gather", "ddp" or "config").

        Raises ``NotSupported`` when that component is not part of this implementation.
        """
        path = getattr(self, component)
        if path is None:
            raise NotSupported(f"no {component} module was named")
        return importlib.import_module(path)

    def gather_accepts(self, keyword: str) -> bool:
        """Whether the gather module's ``all_gather_with_grad`` takes ``keyword`` (e.g. "group")."""
        function = self.module("gather").all_gather_with_grad
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            return False
        return keyword in parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        )

    def require_gather_keyword(self, keyword: str) -> None:
        """Raise ``NotSupported`` unless ``all_gather_with_grad`` takes ``keyword``."""
        if not self.gather_accepts(keyword):
            raise NotSupported(f"{self.gather}.all_gather_with_grad takes no {keyword}= keyword")


#: The bundled implementation.
REFERENCE = Implementation()

#: Named module layouts, for ``--preset``.
PRESETS = {
    "nemo_dist": REFERENCE,
    "nemo_automodel": Implementation(
        gather="nemo_automodel.components.loss.dist_utils",
        ddp="nemo_automodel.components.distributed.ddp",
        config="nemo_automodel.components.distributed.config",
    ),
}
