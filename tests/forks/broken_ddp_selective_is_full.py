"""Broken DDP fork (test fixture): ``activation_checkpointing="selective"`` checkpoints fully.

Guarded by ``ddp.activation_checkpointing_selective``: selective recomputes fewer matmuls than full.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, activation_checkpointing=bool(config.activation_checkpointing)),
    "The reference manager, except that selective checkpointing is mapped to full checkpointing.",
)
