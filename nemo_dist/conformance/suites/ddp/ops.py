"""What the aten ops a rank runs show: the ops of each counted sub-module, and the dtype each op computes in.

:class:`OpCounter` (:class:`MatmulCounter` for the hand-made models) and
:class:`OpDtypes` are ``TorchDispatchMode``s, entered on a rank around a
forward or a backward. They see each op after autocast has cast its inputs and below
autograd, so they see what actually executes: under selective checkpointing
an op whose output was saved is not run again in backward (the checkpoint's
own dispatch mode, entered inside this one, answers it from its cache), so it
is not counted; under full checkpointing every op of the block runs again.
Besides matmuls the counters count the other ops that compute a tensor
(views and metadata queries aside): a selective policy that saves every
op's output runs none of them again, and saves no memory.
The autograd engine carries the mode stack into its threads, so a backward
on a GPU is observed too. ``TorchDispatchMode`` has no public import path in
torch; torch's own selective checkpointing is built on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nemo_dist.conformance.engine.errors import NotApplicable
from nemo_dist.conformance.suites.ddp.models import running

__all__ = ["MATMULS", "MatmulCounter", "OpCounter", "OpDtypes", "require_seen"]

_aten = torch.ops.aten
#: The matmul ops, as overload packets (``aten.linear`` is decomposed into these above the dispatch modes).
MATMULS = frozenset(
    op for op in (getattr(_aten, name, None) for name in ("mm", "addmm", "bmm", "baddbmm", "linear")) if op is not None
)


def _packet(func: Any) -> Any:
    return getattr(func, "overloadpacket", func)


class OpCounter(TorchDispatchMode):
    """Counts the ops executed while this mode is on, per what ``running()`` names as running (None: not counted).

    ``matmuls[what]`` counts its matmuls and ``others[what]`` its other ops
    that compute a tensor. Views (``aten.t``; ``aten.detach``, which
    checkpointing runs on what it saves) and ops returning no tensor are not
    counted: running them again saves no memory.
    """

    def __init__(self, running: Callable[[], Hashable | None]) -> None:
        super().__init__()
        self.running = running
        self.matmuls: Counter[Hashable] = Counter()
        self.others: Counter[Hashable] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        counted = self.running()
        out = func(*args, **(kwargs or {}))
        if counted is not None:
            self.count(counted, func, out)
        return out

    def count(self, counted: Hashable, func: Any, out: Any) -> None:
        """Count op ``func``, which returned ``out``, as run by ``counted``."""
        if _packet(func) in MATMULS:
            self.matmuls[counted] += 1
        elif not getattr(func, "is_view", False) and _computes_tensor(out):
            self.others[counted] += 1


class MatmulCounter(OpCounter):
    """An :class:`OpCounter` of the hand-made models' counted sub-modules (:func:`~.models.running`)."""

    def __init__(self) -> None:
        super().__init__(running)


def _computes_tensor(out: Any) -> bool:
    """Whether an op's output is, or holds, a tensor."""
    return isinstance(out, torch.Tensor) or (
        isinstance(out, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in out)
    )


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


def require_seen(dtypes: list[str], unseen: str) -> None:
    """Raise ``NotApplicable`` (``unseen``, and what follows) when a recorder's ``dtypes`` are empty.

    The models the checks run execute matmuls in forward and backward; a recorder that saw none was blind
    to them (ops hidden from dispatch modes), and the dtypes cannot be judged.
    """
    if not dtypes:
        raise NotApplicable(f"{unseen}, so the dtype they compute in could not be observed")
