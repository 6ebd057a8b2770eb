"""Rank side of one call of a gather callable: the values filled for it, and its result made readable.

:func:`filled` replaces each :class:`~nemo_dist.conformance.adapters.symbols.Symbol`
among a call's values by what it stands for in this call (the call's group,
every rank's row count, W empty buffers like ``x`` ...: see
:data:`~nemo_dist.conformance.adapters.symbols.SYMBOLS`); :func:`world_group` is
the process group a call without a subgroup passes where the callable needs
one; :func:`landed` waits on results whose collective may still be in flight
(torch's ``AsyncCollectiveTensor``, which ``DTensor.to_local()`` and the
functional collectives return), so nothing reads a buffer before its values
arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.adapters.symbols import Factory, Symbol
from nemo_dist.conformance.engine.importing import made

__all__ = ["filled", "landed", "world_group"]


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_group() -> Any:
    """The whole world's process group (``dist.group.WORLD``); None outside a process group."""
    return dist.group.WORLD if _initialized() else None


def _row_sizes(x: torch.Tensor, group: Any, size: int) -> list[int]:
    """Every rank's row count (dim 0 of ``x``; 0 for a 0-d ``x``) in ``group``, in group rank order."""
    mine = torch.tensor([x.shape[0] if x.dim() else 0], dtype=torch.int64, device=x.device)
    if size == 1 or not _initialized():
        return [int(mine.item())]
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    return [int(n.item()) for n in every]


def _value(name: str, x: Any, group: Any) -> Any:
    """What symbol ``name`` stands for in a call on ``x`` over ``group`` (None: the whole world)."""
    size = dist.get_world_size(group) if _initialized() else 1
    if name == "group":
        return world_group() if group is None else group
    if name == "world_size":
        return size
    if name == "rank":
        return dist.get_rank(group) if _initialized() else 0
    if name == "row_sizes":
        return _row_sizes(x, group, size)
    if name == "out_buffers":
        return [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
    raise ValueError(f"unknown symbol @{name}")


def filled(values: Mapping[str, Any], x: Any, group: Any) -> dict[str, Any]:
    """``values`` with each symbol replaced by its value for a call on ``x`` over ``group``.

    ``@row_sizes`` is a collective of ``group`` (every member fills it, in
    the same call); the others are local. A ``MODULE:NAME()`` factory is called
    once per rank (:func:`~nemo_dist.conformance.engine.importing.made`).
    """
    return {
        k: _value(v.name, x, group) if isinstance(v, Symbol) else made(v.path) if isinstance(v, Factory) else v
        for k, v in values.items()
    }


def _async_type() -> type | None:
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:  # a torch without functional collectives returns none
        return None
    return AsyncCollectiveTensor


def _waited(value: Any, pending: type) -> Any:
    if not isinstance(value, pending):
        return value
    from torch.distributed._functional_collectives import wait_tensor

    # wait_tensor keeps autograd (its backward is the identity); the subclass's own .wait() drops it.
    return wait_tensor(value)


def landed(out: Any) -> Any:
    """``out`` with every tensor whose collective may be in flight waited on (in a tuple or list return too).

    Any other value comes back as it is (the same object), so a list
    holding ``x`` itself still holds it.
    """
    pending = _async_type()
    if pending is None:
        return out
    if isinstance(out, (tuple, list)) and any(isinstance(o, pending) for o in out):
        return (tuple if isinstance(out, tuple) else list)(_waited(o, pending) for o in out)
    return _waited(out, pending)
