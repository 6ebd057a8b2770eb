"""Broken DDP fork (test fixture): ``gradient_as_bucket_view`` is always True.

Guarded by ``ddp.gradient_as_bucket_view``: with False, no gradient may live in a bucket buffer.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, gradient_as_bucket_view=True),
    "The reference manager, except that gradients are always bucket views.",
)
