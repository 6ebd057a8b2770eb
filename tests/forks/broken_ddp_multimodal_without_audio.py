"""Broken DDP fork (test fixture): scope ``"multimodal"`` checkpoints the vision group only, not audio.

Guarded by ``ddp.activation_checkpointing_full``: scope "multimodal" selects the vision and the audio blocks.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(
        config,
        activation_checkpointing_scope=[
            "vision" if name == "multimodal" else name for name in config.activation_checkpointing_scope
        ],
    ),
    "The reference manager, except that 'multimodal' is read as 'vision'.",
)
