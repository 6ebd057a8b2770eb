"""Broken DDP fork (test fixture): ``bucket_cap_mb`` reaches DDP multiplied by 1024 (as if DDP took KiB).

Guarded by ``ddp.bucket_cap_mb``: the bucket layout must be torch DDP's own for the same cap in MiB.
"""

from __future__ import annotations

import dataclasses

from tests.forks import manager_changing_config

__all__ = ["DDPManager"]

DDPManager = manager_changing_config(
    lambda config: dataclasses.replace(config, bucket_cap_mb=config.bucket_cap_mb and config.bucket_cap_mb * 1024),
    "The reference manager, except that the bucket cap is forwarded multiplied by 1024.",
)
