"""The fsdp2 policy check: every FSDP unit holds the configured mixed-precision policy, and each field shows.

The dtype checks of :mod:`.checks` observe compute, output and reduction
dtypes on a model whose layers take nothing but the residual stream, which
comes out of the embedding unit already in the compute dtype: a dropped
``cast_forward_inputs`` is invisible there. This check reads, per FSDP unit,
the four fields of the ``MixedPrecisionPolicy`` FSDP holds for it
(:mod:`.policy_ranks`) and compares them with what the config says (``None``:
upstream's default, bf16 params, fp32 reduce, no output cast,
``cast_forward_inputs=False``; an explicit policy: its fields, torch's
defaults for the rest), and it shows the effect of each on a model whose
layers also take a float32 side input: with ``cast_forward_inputs`` and a
``param_dtype`` the side input reaches the layer in that dtype, without it in
float32.
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.fsdp2 import policy_ranks
from nemo_dist.conformance.suites.fsdp2.causes import fsdp2_check
from nemo_dist.conformance.suites.fsdp2.messages import HeldPolicies
from nemo_dist.conformance.suites.fsdp2.models import LAYERS

__all__ = ["POLICIES", "every_unit_holds_the_configured_policy", "expected_layer_inputs", "expected_policy"]

_SEED = 7
#: The policies checked (None: the config's default), as the config's ``mp_policy`` field values.
POLICIES: list[dict[str, Any] | None] = [
    None,
    {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
    {"param_dtype": "bfloat16", "reduce_dtype": "float32", "cast_forward_inputs": False},
    {"param_dtype": "bfloat16", "output_dtype": "float32"},
]
#: torch's ``MixedPrecisionPolicy`` defaults, and upstream's default policy (``mp_policy=None``).
_TORCH_DEFAULTS = {"param_dtype": None, "reduce_dtype": None, "output_dtype": None, "cast_forward_inputs": True}
_UPSTREAM_DEFAULT = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": None,
                     "cast_forward_inputs": False}


def expected_policy(mp_policy: dict[str, Any] | None) -> dict[str, Any]:
    """The four fields every unit must hold for config value ``mp_policy``."""
    return dict(_UPSTREAM_DEFAULT) if mp_policy is None else {**_TORCH_DEFAULTS, **mp_policy}


def expected_layer_inputs(policy: dict[str, Any]) -> list[list[str]]:
    """Per layer, the dtypes its forward receives (residual stream, float32 side input) under ``policy``.

    Each unit computes in ``param_dtype`` (float32 without one), casts its output to ``output_dtype`` where set,
    and casts floating inputs to ``param_dtype`` where ``cast_forward_inputs`` and a ``param_dtype`` are set; a
    layer adds its side input to the residual stream in the dtype it computed in.
    """
    compute = policy["param_dtype"] or "float32"

    def arriving(dtype: str) -> str:
        return compute if policy["cast_forward_inputs"] and policy["param_dtype"] else dtype

    residual = policy["output_dtype"] or compute  # what the embedding unit, and each layer, hands on
    return [[arriving(residual), arriving("float32")] for _ in range(LAYERS)]


@fsdp2_check("fsdp2.every_unit_holds_the_configured_policy", once=True)
def every_unit_holds_the_configured_policy(world: WorldLike, impl: Implementation) -> None:
    """Every FSDP unit holds the config's MixedPrecisionPolicy, all four fields (default policy included), and a
    layer's float32 side input arrives cast or not as cast_forward_inputs says."""
    for mp_policy in POLICIES:
        policy = expected_policy(mp_policy)
        results: list[HeldPolicies] = world.run(policy_ranks.held_policies, impl, _SEED, mp_policy)
        for rank, found in enumerate(results):
            where = f"mp_policy={'None (the default)' if mp_policy is None else mp_policy}, rank {rank}"
            assert found.units, f"{where}: no FSDP unit in the sharded model"
            for unit, held in found.units.items():
                assert held == policy, f"{where}: unit {unit or '(root)'} holds {held}, expected {policy}"
            inputs = expected_layer_inputs(policy)
            assert found.layers == inputs, (
                f"{where}: the layers' forwards received (residual stream, float32 side input) in {found.layers}, "
                f"expected {inputs} (cast_forward_inputs={policy['cast_forward_inputs']})"
            )
