"""Independent DDP fork (test fixture): ``DDPManager`` written from the contract (docs/contract.md), no nemo_dist code.

Layer groups its own way too, including the one rule beyond the contract that
nemo_dist documents (a speech encoder-decoder's encoder is the audio group).
Checkpointing its own way: each selected block is replaced by a small wrapper
module that runs the block through ``torch.utils.checkpoint.checkpoint``
(non-reentrant), with a selective context saving matmul outputs for
"selective". Autocast through a ``DistributedDataParallel`` subclass. It must
pass every ddp and config check: the checks prove behaviour, not the
reference's code.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

__all__ = ["DDPManager"]

_SAVE = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]


class _Checkpointed(nn.Module):
    """Runs ``block`` under non-reentrant checkpointing (selective when asked)."""

    def __init__(self, block: nn.Module, selective: bool) -> None:
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.selective:
            context = functools.partial(create_selective_checkpoint_contexts, _SAVE)
            return checkpoint(self.block, *args, use_reentrant=False, context_fn=context, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


class _AutocastDDP(DistributedDataParallel):
    """DDP whose forward runs under ``torch.autocast``."""

    autocast_dtype: torch.dtype | None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype):
            return super().forward(*args, **kwargs)


def _lists(module: nn.Module) -> list[nn.ModuleList]:
    return [m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]


def _biggest(module: nn.Module | None) -> nn.ModuleList | None:
    if module is None:
        return None
    found = _lists(module)
    return max(found, key=lambda c: sum(p.numel() for p in c.parameters())) if found else None


def _attr(module: nn.Module, *path: str) -> nn.Module | None:
    for name in path:
        module = getattr(module, name, None)  # type: ignore[assignment]
        if not isinstance(module, nn.Module):
            return None
    return module


def _groups(model: nn.Module) -> dict[str, nn.ModuleList]:
    groups: dict[str, nn.ModuleList] = {}
    encoder, decoder = _attr(model, "model", "encoder", "layers"), _attr(model, "model", "decoder", "layers")
    if getattr(getattr(model, "config", None), "num_mel_bins", None) and isinstance(encoder, nn.ModuleList):
        # A speech encoder-decoder (Whisper): the encoder hears, the decoder writes.
        groups["audio"] = encoder
        if isinstance(decoder, nn.ModuleList):
            groups["language"] = decoder
        return groups
    for path in (
        ("model", "layers"),
        ("layers",),
        ("model", "language_model", "layers"),
        ("language_model", "layers"),
        ("language_model", "model", "layers"),
    ):
        found = _attr(model, *path)
        if isinstance(found, nn.ModuleList):
            groups["language"] = found
            break
    for group, names in (
        ("vision", ("visual", "vision_tower", "vision_model")),
        ("audio", ("audio_tower", "audio_model")),
    ):
        for name in names:
            container = _biggest(_attr(model, name)) or _biggest(_attr(model, "model", name))
            if container is not None:
                groups[group] = container
                break
    if not groups:
        container = _biggest(model)
        if container is not None:
            groups["language"] = container
    return groups


def _checkpoint(model: nn.Module, mode: bool | str, scope: tuple[str, ...]) -> None:
    wanted = {"language", "vision", "audio"} if "all" in scope else set(scope)
    if "multimodal" in wanted:
        wanted |= {"vision", "audio"}
    for group, container in _groups(model).items():
        if group not in wanted:
            continue
        for index, block in enumerate(container):
            if isinstance(block, _Checkpointed) or not any(p.requires_grad for p in block.parameters()):
                continue
            container[index] = _Checkpointed(block, selective=mode == "selective")


class DDPManager:
    """Wraps models in DDP as a config says; needs an initialised process group."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.activation_checkpointing: bool | str = config.activation_checkpointing
        self.activation_checkpointing_scope: tuple[str, ...] = config.activation_checkpointing_scope
        self.broadcast_buffers: bool = config.broadcast_buffers
        self.find_unused_parameters: bool = config.find_unused_parameters
        self.static_graph: bool = config.static_graph
        self.bucket_cap_mb: float | None = config.bucket_cap_mb
        self.gradient_as_bucket_view: bool = config.gradient_as_bucket_view
        self.autocast_dtype: torch.dtype | None = getattr(config, "autocast_dtype", None)
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("DDPManager needs torch.distributed initialised (init_process_group first)")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if dist.get_backend() == "nccl" and torch.cuda.is_available():
            self.device = torch.device("cuda", self.rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    def parallelize(self, model: nn.Module) -> DistributedDataParallel:
        """Checkpoint the selected blocks, move to ``device`` and wrap in DDP with the config's options."""
        if self.activation_checkpointing:
            _checkpoint(model, self.activation_checkpointing, tuple(self.activation_checkpointing_scope))
        model.to(self.device)
        options: dict[str, Any] = {
            "device_ids": [self.device] if self.device.type == "cuda" else None,
            "broadcast_buffers": self.broadcast_buffers,
            "find_unused_parameters": self.find_unused_parameters,
            "static_graph": self.static_graph,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
        }
        if self.bucket_cap_mb is not None:
            options["bucket_cap_mb"] = self.bucket_cap_mb
        cls = DistributedDataParallel if self.autocast_dtype is None else _AutocastDDP
        with warnings.catch_warnings():
            # torch 2.13 deprecates broadcast_buffers; the old keyword keeps "no sync at all" for False.
            warnings.filterwarnings("ignore", message=r"`broadcast_buffers` is deprecated", category=FutureWarning)
            wrapped = cls(model, **options)
        if isinstance(wrapped, _AutocastDDP):
            wrapped.autocast_dtype = self.autocast_dtype
        return wrapped
