"""Messages between the World (parent) and its rank processes (children).

Every message is one pickled object sent over a private socket pair wrapped in
``multiprocessing.connection.Connection``. Nothing is ever parsed from printed
text or exit codes. Parent to child: :class:`Init` once, then ``Call`` tuples
``("call", seq, blob, sys_path)`` (``blob`` is the pickled ``(fn, args,
kwargs)``, ``sys_path`` the parent's ``sys.path`` when it changed, else None) or the
``EXIT`` tuple. Child to parent: :class:`Ready` once, then one :class:`Returned`
or :class:`Raised` per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CALL = "call"
EXIT = ("exit",)


@dataclass(frozen=True)
class Init:
    """Everything a rank needs to join the world."""

    rank: int
    world_size: int
    backend: str
    store_port: int
    pg_timeout_s: float
    sys_path: list[str]
    parent_pid: int
    stack_file: str
    #: Pickled ``(fn, args, kwargs)`` every rank runs once after joining, before it reports ready; or None.
    setup: bytes | None = None
    #: File a stack dump is appended to on each SIGUSR1 (progress probes), or "" for none.
    sample_file: str = ""


@dataclass(frozen=True)
class Ready:
    """The rank joined the process group and waits for calls."""

    rank: int


@dataclass(frozen=True)
class RankWarning:
    """A warning a rank's call emitted; the parent re-emits it under its own filters."""

    message: str
    category: str  # "module:qualname" of the Warning subclass
    filename: str
    lineno: int


@dataclass(frozen=True)
class Returned:
    """The call ``seq`` returned ``value`` on ``rank``, emitting ``warnings`` on the way."""

    seq: int
    rank: int
    value: Any
    warnings: tuple[RankWarning, ...] = ()


@dataclass(frozen=True)
class Raised:
    """The call ``seq`` raised on ``rank`` (or could not be unpickled/answered)."""

    seq: int
    rank: int
    exc_type: str
    message: str
    traceback: str


def barrier() -> None:
    """Health check run on every rank: a barrier over the default group."""
    import torch.distributed as dist

    dist.barrier()
