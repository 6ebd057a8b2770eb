"""Broken DDP fork (test fixture): ``static_graph`` is never forwarded to DDP.

Guarded by ``ddp.static_graph``: with True, the DDP object must record a static graph.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, static_graph=False),
    "The reference manager, except that DDP never hears of a static graph.",
)
