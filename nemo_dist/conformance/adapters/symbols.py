"""The values a rank fills for each call of a gather callable (``@symbols``), and stored option values read back.

A ``--gather-kwarg`` or ``--gather-init`` VALUE (and a ``--ddp-kwarg`` one,
whose symbols are :data:`WRAPPER_SYMBOLS`) is kept as text: a Python
literal's repr; ``@name``, one of :data:`SYMBOLS`, which the rank fills
for each call since a fixed literal cannot follow the call's input and
group; or ``MODULE:NAME()``, a factory each rank calls once (a
:class:`Factory`), for a value no literal can spell (a cluster environment,
a handler object). :func:`value_of` turns a stored text back into its
value. Standard library only: the bottom of the conformance engine.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["FACTORY_TEXT", "INIT_SYMBOLS", "SYMBOLS", "WRAPPER_SYMBOLS", "Factory", "Symbol", "value_of"]

#: The values a rank fills for each call, by name (``--gather-kwarg NAME=@SYMBOL``), and what each holds.
SYMBOLS: dict[str, str] = {
    "group": "the call's process group: the subgroup a group check passes, else the whole world's (dist.group.WORLD)",
    "rank": "this rank's rank in the call's group",
    "world_size": "the number of ranks the call gathers from (its group's size)",
    "row_sizes": "the list of every rank's row count (dim 0 of x) in rank order, learned by a small all-gather",
    "out_buffers": "a list of one empty contiguous tensor like x (shape, dtype, device) per rank of the call's group",
}
#: The symbols a constructor can take (``--gather-init``): it runs once per rank, in the whole world, on no x.
INIT_SYMBOLS: tuple[str, ...] = ("group", "rank", "world_size")
#: The values a rank fills for a ``--ddp-kwarg`` of a ``--ddp-fn`` wrapper, by name, and what each holds.
WRAPPER_SYMBOLS: dict[str, str] = {
    "mesh": "the world's DeviceMesh on the backend's device type (cpu under gloo): 1-D over every rank, or the "
    "2-D (dp_replicate, dp_shard) mesh --ddp-mesh RxS names; passed to a parameter that wants a process group "
    "(annotated ProcessGroup, or named process_group, group, pg) it is the mesh's group, and to one that wants "
    "devices (a list of devices, or named parallel_devices) every rank's device",
    "device": "this rank's torch.device: its GPU under nccl (cuda:RANK modulo the GPUs), the CPU under gloo",
    "devices": "the list of every rank's torch.device, in rank order (what a strategy's parallel_devices takes)",
    "rank": "this rank's rank in the world",
    "world_size": "the number of ranks in the world",
}
#: A stored ``MODULE:NAME()``: an importable factory called with no arguments, once on each rank.
FACTORY_TEXT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\(\)")


@dataclass(frozen=True)
class Symbol:
    """A value the rank fills for each call (``@name``, one of :data:`SYMBOLS`)."""

    name: str

    def __repr__(self) -> str:
        return f"@{self.name}"


@dataclass(frozen=True)
class Factory:
    """A value each rank makes once by calling ``path`` (``MODULE:NAME``) with no arguments."""

    path: str

    def __repr__(self) -> str:
        return f"{self.path}()"


def value_of(text: str) -> Any:
    """The value an option's stored text stands for: a :class:`Symbol` for ``@name``, a :class:`Factory` for
    ``MODULE:NAME()``, else the literal.

    ``text`` is what the parsers stored (a literal's repr, ``@name`` or
    ``MODULE:NAME()``); anything else raises what ``ast.literal_eval`` raises.
    """
    if text.startswith("@"):
        return Symbol(text[1:])
    if FACTORY_TEXT.fullmatch(text):
        return Factory(text[:-2])
    return ast.literal_eval(text)
