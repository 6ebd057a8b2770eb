"""Messages between the World (parent) and its rank processes (children).

Every message is one pickled object sent over a private socket pair wrapped in
``multiprocessing.connection.Connection``. Nothing is ever parsed from printed
text or exit codes. Parent to child: :class:`Init` once, then ``Call`` tuples
``("call", seq, blob, sys_path)`` (``blob`` is the pickled ``(fn, args,
kwargs)``, ``sys_path`` the parent's ``sys.path`` when it changed, else None) or the
``EXIT`` tuple. Child to parent: :class:`Ready` once, then one :class:`Returned`
or :class:`Raised` per call. Both sides pickle with :func:`dumps`, which
writes plain CPU tensors as raw bytes.
"""

from __future__ import annotations

import io
import pickle
import sys
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


def _rebuild_dense(data: bytes, dtype: Any, shape: tuple[int, ...], requires_grad: bool) -> Any:
    """The tensor :func:`dumps` wrote as raw bytes: contiguous, on CPU, a storage of its own."""
    import torch

    if not data:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    return tensor.requires_grad_() if requires_grad else tensor


def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a new contiguous tensor of ``shape`` (what :func:`_rebuild_dense` gives back)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _Pickler(pickle.Pickler):
    """A pickler that writes a plain, dense, contiguous CPU tensor as its raw bytes.

    torch pickles every tensor through ``torch.save`` of its storage, which
    costs far more than the copy for the small tensors checks send. Only a
    tensor whose pickled form carries nothing but dtype, shape, values and
    ``requires_grad`` takes the fast path: an exact ``torch.Tensor`` leaf on
    the CPU, strided and contiguous, owning the whole of its storage (so no
    view of another tensor is separated from it) with a new tensor's strides, with no conjugate or
    negative bit and no names. Every other object pickles as usual.
    """

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        if (
            obj.device.type != "cpu"
            or obj.layout is not torch.strided
            or obj.grad_fn is not None
            or obj.is_quantized
            or obj.is_conj()
            or obj.is_neg()
            or any(name is not None for name in getattr(obj, "names", ()))
            or obj.stride() != _row_major_strides(obj.shape)
            or obj.storage_offset() != 0
            or obj.untyped_storage().nbytes() != obj.numel() * obj.element_size()
        ):
            return NotImplemented
        data = obj.detach().reshape(-1).view(torch.uint8).numpy().tobytes() if obj.numel() else b""
        return _rebuild_dense, (data, obj.dtype, tuple(obj.shape), obj.requires_grad)


def dumps(obj: Any) -> bytes:
    """``pickle.dumps(obj)`` at the highest protocol, plain CPU tensors written as raw bytes (see ``_Pickler``)."""
    buffer = io.BytesIO()
    _Pickler(buffer, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
