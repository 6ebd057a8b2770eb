"""The contract's ``DDPConfig`` defaults, and a hypothesis strategy for valid ``DDPConfig`` keyword dicts.

The ddp suite draws the configs it trains with; the config suite checks a config against these defaults. They
belong to the components' contract, not to the harness (``nemo_dist.testing`` knows no component).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["DDP_CONFIG_DEFAULTS", "SCOPE_GROUPS", "ddp_configs"]

#: Layer groups a checkpointing scope may combine (besides "all" alone).
SCOPE_GROUPS = ("language", "vision", "audio", "multimodal")

#: The contract's default of every DDPConfig field (docs/contract.md), as a user writes it.
DDP_CONFIG_DEFAULTS: dict[str, Any] = {
    "activation_checkpointing": False,
    "activation_checkpointing_scope": "all",
    "broadcast_buffers": False,
    "find_unused_parameters": False,
    "static_graph": False,
    "bucket_cap_mb": None,
    "gradient_as_bucket_view": False,
    "autocast_dtype": None,
}


def _scopes() -> st.SearchStrategy[Any]:
    groups = st.lists(st.sampled_from(SCOPE_GROUPS), min_size=1, max_size=3, unique=True)
    return st.one_of(
        st.just("all"),
        st.sampled_from(SCOPE_GROUPS),
        groups.map(",".join),
        groups.map("+".join),
        groups,
    )


def _autocast_dtypes() -> st.SearchStrategy[Any]:
    import torch

    return st.sampled_from([None, torch.bfloat16])


def ddp_configs(**fixed: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Draw valid ``DDPConfig`` keyword dicts (plain dicts of field values).

    Every field is drawn from its valid values: ``activation_checkpointing`` from
    False/True/"full"/"selective", the scope as "all", one group, groups joined by
    "," or "+", or a list of groups; ``bucket_cap_mb`` None or a small positive
    MiB value; the four bools; ``autocast_dtype`` None or ``torch.bfloat16``.
    Keyword arguments fix fields to the given values (``ddp_configs(static_graph=False)``).
    Examples shrink field by field toward the defaults (False, "all", None), so a
    failing config shrinks to the fields it needs.
    """
    unknown = sorted(set(fixed) - set(DDP_CONFIG_DEFAULTS))
    if unknown:
        raise TypeError(
            f"ddp_configs: unknown DDPConfig field(s) {unknown}; expected some of {sorted(DDP_CONFIG_DEFAULTS)}"
        )
    fields: dict[str, st.SearchStrategy[Any]] = {
        "activation_checkpointing": st.sampled_from([False, True, "full", "selective"]),
        "activation_checkpointing_scope": _scopes(),
        "broadcast_buffers": st.booleans(),
        "find_unused_parameters": st.booleans(),
        "static_graph": st.booleans(),
        "bucket_cap_mb": st.one_of(st.none(), st.sampled_from([0.001, 0.01, 0.1, 1.0, 25.0])),
        "gradient_as_bucket_view": st.booleans(),
        "autocast_dtype": _autocast_dtypes(),
    }
    for name, value in fixed.items():
        fields[name] = st.just(value)
    return st.fixed_dictionaries(fields)
