"""Rank-side functions of the policy checks: the mixed-precision policy each FSDP unit holds, and what it casts.

:func:`held_policies` shards a float32 :class:`~.models.SideInputLM` through the
implementation with a policy and returns, per FSDP unit, the four fields of
the ``MixedPrecisionPolicy`` FSDP holds for it (torch's private
``_get_fsdp_state()``: NOT SUPPORTED where torch has none), and what each
layer's ``forward`` received after FSDP's pre-forward casts: the dtype of the
residual stream and of its float32 side input, which ``cast_forward_inputs``
decides.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.templates import manual_seed
from nemo_dist.conformance.suites.fsdp2.calls import device, mesh, own_fsdp_internals, parallelize
from nemo_dist.conformance.suites.fsdp2.messages import HeldPolicies
from nemo_dist.conformance.suites.fsdp2.models import SideInputLM
from nemo_dist.conformance.suites.fsdp2.ranks import PER_RANK, _state, _units

__all__ = ["POLICY_FIELDS", "held_policies"]

#: The fields of torch's ``MixedPrecisionPolicy``.
POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


def _named(value: Any) -> Any:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def held_policies(impl: Implementation, seed: int, mp_policy: dict[str, Any] | None) -> HeldPolicies:
    """Shard a float32 side-input model with ``mp_policy`` (None: the default); per unit its held policy.

    Also, per layer, the dtypes its first forward received (residual stream, side input).
    """
    with own_fsdp_internals():
        manual_seed(seed)
        model = SideInputLM().to(device())
        layers = list(model.layers)
        sharded = parallelize(impl, model, mesh(1), {"mp_policy": mp_policy})
        units = {}
        for name, unit in _units(sharded).items():
            held = _state(unit)._mp_policy
            units[name] = {field: _named(getattr(held, field)) for field in POLICY_FIELDS}
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 10, (PER_RANK * dist.get_world_size(),), generator=generator)
        local = tokens[dist.get_rank() * PER_RANK : (dist.get_rank() + 1) * PER_RANK].to(device())
        F.cross_entropy(sharded(local).float(), local).backward()
        return HeldPolicies(units=units, layers=[list(layer.seen[0]) for layer in layers])  # type: ignore[index]
