"""``FSDP2Config``: what the FSDP2 parallelizer builds, validated at construction.

The data-parallel fields of NeMo AutoModel 0.7.0's ``FSDP2Config``
(``nemo_automodel/components/distributed/config.py``), with upstream's
defaults. Upstream's tensor-parallel and compile fields (``sequence_parallel``,
``tp_plan``, ``enable_async_tensor_parallel``, ``enable_compile``) are accepted
at their defaults only: any other value raises ``NotImplementedError`` saying
why, since this component is data parallelism alone. Upstream's
``patch_is_packed_sequence`` and ``autocast_dtype`` (used by upstream's recipes
and its transformers patch, not by its parallelizer) and ``multimodal`` (the
frozen-tower policy; this component always applies upstream's default,
``"root"``) are not offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

from nemo_dist.distributed.config import _normalise_checkpointing, _normalise_scope

__all__ = ["FSDP2Config", "default_mp_policy"]


def default_mp_policy() -> MixedPrecisionPolicy:
    """Upstream's default policy: bf16 parameters in forward/backward, fp32 gradient reduction.

    ``output_dtype=None`` (outputs keep the dtype they were computed in, bf16
    for a float module) and ``cast_forward_inputs=False``: unlike torch's own
    default, floating-point inputs are NOT cast to bf16, so a float32 tensor
    fed straight into a float32 ``Linear`` under this policy fails with a dtype
    mismatch; language models are fed token ids, which an embedding turns into
    bf16 activations.
    """
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
        output_dtype=None,
        cast_forward_inputs=False,
    )


#: Upstream fields this component does not implement: name -> (the only value accepted, why).
_NOT_SUPPORTED: dict[str, tuple[Any, str]] = {
    "enable_async_tensor_parallel": (False, "async tensor parallelism needs tensor parallelism"),
    "enable_compile": (False, "per-layer torch.compile is not part of this component"),
}


def _require_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"FSDP2Config.{name} must be a bool, got {value!r} ({type(value).__name__})")


def _require_depth(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"FSDP2Config.{name} must be an int (a number of FSDP units), got {value!r}")
    if value < 0:
        raise ValueError(f"FSDP2Config.{name} must be >= 0 (0 turns that prefetch off), got {value!r}")


@dataclass
class FSDP2Config:
    """Configuration of the FSDP2 parallelizer; every field is checked when it is built.

    Wrong types raise ``TypeError`` and bad values ``ValueError``, each naming
    the field and the value; an upstream field this component does not
    implement, set away from its default, raises ``NotImplementedError``
    naming the field and why. ``mp_policy=None`` becomes
    :func:`default_mp_policy`; ``activation_checkpointing`` and its scope are
    checked and normalised as ``DDPConfig`` checks them.
    """

    #: ``torch.distributed.fsdp.MixedPrecisionPolicy``; ``None`` (and the default) is
    #: :func:`default_mp_policy`: bf16 compute, fp32 reduction, inputs and outputs not cast.
    #: ``MixedPrecisionPolicy()`` turns mixed precision off.
    mp_policy: Union[MixedPrecisionPolicy, None] = field(default_factory=default_mp_policy)
    #: ``CPUOffloadPolicy`` (or any ``OffloadPolicy``) for every FSDP unit; ``None``: no offload.
    offload_policy: Union[OffloadPolicy, None] = None
    #: ``True``/``"full"``: checkpoint whole layer blocks; ``"selective"``: selective
    #: activation checkpointing of the blocks; ``False``: none (as ``DDPConfig``).
    activation_checkpointing: Union[bool, str] = False
    #: Layer groups to checkpoint: ``"all"`` or some of language, vision, audio,
    #: multimodal (vision + audio), as a str joined by "," or "+", or a list.
    activation_checkpointing_scope: Union[str, Sequence[str]] = "all"
    #: Gradient accumulation: ``get_sync_ctx`` reduces gradients on the last
    #: micro-batch only (True) or on every micro-batch (False).
    defer_fsdp_grad_sync: bool = True
    #: ``None``: upstream's heuristic, every layer of a ``ModuleList``/``ModuleDict``
    #: reshards after forward except the last; ``True``/``False``: every layer does or
    #: does not. The root module never reshards after forward, whatever this says.
    reshard_after_forward: Union[bool, None] = None
    #: Explicit forward/backward prefetch chains between the layers of each layer
    #: list. Upstream's docstring says the default is True; its field's default is
    #: False, and that is the default kept here (``fsdp2_strategy_parallelize``'s
    #: keyword, upstream's and this one, does default to True).
    enable_fsdp2_prefetch: bool = False
    #: How many following layers each layer prefetches in backward (0: none).
    fsdp2_backward_prefetch_depth: int = 2
    #: How many following layers each layer prefetches in forward (0: none).
    fsdp2_forward_prefetch_depth: int = 1
    #: Sequence parallelism in the tensor-parallel plan (where the mesh's ``tp`` dim is larger than 1).
    sequence_parallel: bool = False
    #: An explicit tensor-parallel plan: a dict of parallel styles, or ``"module:name"`` of one (None: chosen by
    #: ``nemo_dist.distributed.tensor_parallel.get_parallel_plan``).
    tp_plan: Union[dict, str, None] = None
    #: Not supported (tensor parallelism); only ``False`` is accepted.
    enable_async_tensor_parallel: bool = False
    #: Not supported (per-layer compile); only ``False`` is accepted.
    enable_compile: bool = False

    def __post_init__(self) -> None:
        for name, (accepted, why) in _NOT_SUPPORTED.items():
            value = getattr(self, name)
            if value is not accepted:
                raise NotImplementedError(
                    f"FSDP2Config.{name}={value!r} is not supported: {why}, and nemo_dist's FSDP2 component "
                    f"implements data parallelism only (leave it at {accepted!r})"
                )
        if self.mp_policy is None:
            self.mp_policy = default_mp_policy()
        if not isinstance(self.mp_policy, MixedPrecisionPolicy):
            raise TypeError(
                "FSDP2Config.mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy or None, "
                f"got {self.mp_policy!r}"
            )
        if self.offload_policy is not None and not isinstance(self.offload_policy, OffloadPolicy):
            raise TypeError(
                "FSDP2Config.offload_policy must be a torch.distributed.fsdp.CPUOffloadPolicy (an OffloadPolicy) "
                f"or None, got {self.offload_policy!r}"
            )
        self.activation_checkpointing = _normalise_checkpointing(self.activation_checkpointing, "FSDP2Config")
        self.activation_checkpointing_scope = _normalise_scope(self.activation_checkpointing_scope, "FSDP2Config")
        for name in ("defer_fsdp_grad_sync", "enable_fsdp2_prefetch", "sequence_parallel"):
            _require_bool(name, getattr(self, name))
        if self.tp_plan is not None and not isinstance(self.tp_plan, (dict, str)):
            raise TypeError(
                f"FSDP2Config.tp_plan must be a dict of parallel styles, a 'module:name' str or None, got "
                f"{self.tp_plan!r} ({type(self.tp_plan).__name__})"
            )
        if self.reshard_after_forward is not None:
            _require_bool("reshard_after_forward", self.reshard_after_forward)
        for name in ("fsdp2_backward_prefetch_depth", "fsdp2_forward_prefetch_depth"):
            _require_depth(name, getattr(self, name))
