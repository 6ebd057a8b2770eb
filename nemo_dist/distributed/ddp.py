"""``parallelize_ddp`` and ``DDPManager``: wrap a model in ``DistributedDataParallel`` as a ``DDPConfig`` says.

``parallelize_ddp(model, config, *, device=None)`` is upstream's API since
nemo-automodel 0.7; ``DDPManager(config).parallelize(model)`` is the seed's.
Both have the same semantics here and neither is deprecated. Unlike upstream,
a world of one rank is wrapped in DDP too, and the model's dtype is never
changed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nemo_dist.distributed._process_group import require_default_group
from nemo_dist.distributed.activation_checkpointing import apply_activation_checkpointing
from nemo_dist.distributed.config import DDPConfig

__all__ = ["DDPManager", "parallelize_ddp"]

logger = logging.getLogger(__name__)

_DDP_PARAMETERS = inspect.signature(DistributedDataParallel.__init__).parameters


def _buffer_sync_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """DDP arguments that keep upstream's ``broadcast_buffers`` meaning on any torch.

    torch >= 2.13 deprecates ``broadcast_buffers`` for ``forward_sync_buffers``,
    but ``forward_sync_buffers=False`` still syncs buffers at construction, and
    upstream's False means no sync at all.  So True maps to the new argument
    and False keeps the old one (its FutureWarning filtered where DDP is built).
    """
    if broadcast_buffers and "forward_sync_buffers" in _DDP_PARAMETERS:
        return {"forward_sync_buffers": True}
    return {"broadcast_buffers": broadcast_buffers}


def _resolve_device() -> torch.device:
    """This rank's device; ``RuntimeError`` without an initialised default process group.

    With the NCCL backend and CUDA: ``cuda:(rank % device_count)``, made
    current; otherwise CPU.
    """
    require_default_group("nemo_dist DDP")
    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        index = dist.get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def parallelize_ddp(
    model: nn.Module, config: DDPConfig, *, device: torch.device | None = None
) -> DistributedDataParallel:
    """Wrap ``model`` in DistributedDataParallel as ``config`` says; return the wrapper.

    Applies activation checkpointing when enabled, moves the model to
    ``device`` (default: this rank's device, see ``DDPManager``; a
    ``RuntimeError`` without an initialised process group), and wraps it with
    ``device_ids=[device]`` on CUDA (None otherwise), forwarding
    ``broadcast_buffers``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view`` and ``bucket_cap_mb`` (when not None). With
    ``autocast_dtype`` set, the wrapper's forward runs under autocast. A world
    of one rank is wrapped too; the model's dtype is left as it is.
    """
    if device is None:
        device = _resolve_device()
    if config.activation_checkpointing:
        apply_activation_checkpointing(model, config.activation_checkpointing, config.activation_checkpointing_scope)
    model = model.to(device)
    kwargs: dict[str, Any] = {
        "device_ids": [device] if device.type == "cuda" else None,
        "find_unused_parameters": config.find_unused_parameters,
        "static_graph": config.static_graph,
        "gradient_as_bucket_view": config.gradient_as_bucket_view,
        **_buffer_sync_kwargs(config.broadcast_buffers),
    }
    if config.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = config.bucket_cap_mb
    with warnings.catch_warnings():
        # Only the deprecation notice for broadcast_buffers=False, kept on
        # purpose (see _buffer_sync_kwargs); every other warning passes.
        warnings.filterwarnings("ignore", message=r"`broadcast_buffers` is deprecated", category=FutureWarning)
        wrapped = DistributedDataParallel(model, **kwargs)
    autocast_dtype = getattr(config, "autocast_dtype", None)
    if autocast_dtype is not None:
        _autocast_forward(wrapped, device.type, autocast_dtype)
    return wrapped


class DDPManager:
    """Manager for distributed training using PyTorch's DDP.

    Construction requires an initialised default process group (``RuntimeError``
    otherwise) and sets ``rank``, ``world_size`` and ``device``: with the NCCL
    backend and CUDA, ``cuda:(rank % device_count)`` made current; otherwise CPU.
    The config's fields are mirrored as attributes of the same names.
    """

    def __init__(self, config: DDPConfig) -> None:
        self.config = config
        self.activation_checkpointing = config.activation_checkpointing
        self.activation_checkpointing_scope = config.activation_checkpointing_scope
        self.broadcast_buffers = config.broadcast_buffers
        self.find_unused_parameters = config.find_unused_parameters
        self.static_graph = config.static_graph
        self.bucket_cap_mb = config.bucket_cap_mb
        self.gradient_as_bucket_view = config.gradient_as_bucket_view
        self.autocast_dtype = getattr(config, "autocast_dtype", None)
        self._setup_distributed()

    def _setup_distributed(self) -> None:
        """Initialize device configuration for DDP: ``rank``, ``world_size``, ``device``."""
        self.device = _resolve_device()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        logger.debug("DDPManager: rank %d of %d on %s", self.rank, self.world_size, self.device)

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Wraps the given model with DistributedDataParallel (DDP).

        ``parallelize_ddp(model, self.config, device=self.device)``: applies
        activation checkpointing when enabled, moves the model to ``device``,
        and wraps it with ``device_ids=[device]`` on CUDA (None on CPU),
        forwarding ``broadcast_buffers``, ``find_unused_parameters``,
        ``static_graph``, ``gradient_as_bucket_view`` and ``bucket_cap_mb`` (when
        not None). With ``autocast_dtype`` set, forward runs under autocast.
        Returns the DDP-wrapped model.
        """
        return parallelize_ddp(model, self.config, device=self.device)


def _autocast_forward(module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Make ``module``'s forward run under ``torch.autocast(device_type, dtype)``."""
    forward = module.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = autocast_forward
