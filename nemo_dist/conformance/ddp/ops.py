"""What the aten ops a rank runs show: matmuls per counted sub-module, and the dtype each op computes in.

Both are ``TorchDispatchMode``s, entered on a rank around a forward or a
backward. They see each op after autocast has cast its inputs and below
autograd, so they see what actually executes: under selective checkpointing
an op whose output was saved is not run again in backward (the checkpoint's
own dispatch mode, entered inside this one, answers it from its cache), so it
is not counted; under full checkpointing every op of the block runs again.
The autograd engine carries the mode stack into its threads, so a backward
on a GPU is observed too. ``TorchDispatchMode`` has no public import path in
torch; torch's own selective checkpointing is built on it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nemo_dist.conformance.ddp.models import running

__all__ = ["MATMULS", "MatmulCounter", "OpDtypes"]

_aten = torch.ops.aten
#: The matmul ops, as overload packets (``aten.linear`` is decomposed into these above the dispatch modes).
MATMULS = frozenset(
    op for op in (getattr(_aten, name, None) for name in ("mm", "addmm", "bmm", "baddbmm", "linear")) if op is not None
)


def _packet(func: Any) -> Any:
    return getattr(func, "overloadpacket", func)


class MatmulCounter(TorchDispatchMode):
    """Adds one to ``matmuls`` of the running counted sub-module (:func:`~.models.running`) per matmul executed."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _packet(func) in MATMULS:
            counted = running()
            if counted is not None:
                counted.matmuls += 1
        return func(*args, **(kwargs or {}))


class OpDtypes(TorchDispatchMode):
    """Records, per op executed, its name and the dtypes of its floating-point tensor outputs.

    ``matmuls`` holds the output dtype of every matmul (as strings), ``floating``
    the set of every floating-point output dtype of any op, as ``"op: dtype"``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.matmuls: list[str] = []
        self.floating: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        dtypes = [str(t.dtype) for t in outputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if _packet(func) in MATMULS:
            self.matmuls.extend(dtypes)
        self.floating.update(f"{_packet(func).__name__}: {dtype}" for dtype in dtypes)
        return out
