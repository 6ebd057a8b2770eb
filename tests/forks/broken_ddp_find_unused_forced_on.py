"""Broken DDP fork (test fixture): ``find_unused_parameters`` is always True.

Guarded by ``ddp.find_unused_parameters``: with False, a skipped parameter must make DDP raise.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, find_unused_parameters=True),
    "The reference manager, except that DDP always looks for unused parameters.",
)
