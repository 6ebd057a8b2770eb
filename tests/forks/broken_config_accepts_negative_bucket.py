"""Broken config fork (test fixture): ``bucket_cap_mb`` is not validated at all.

Guarded by ``config.rejects_bad_values_naming_field``: ``DDPConfig(bucket_cap_mb=-1.0)`` is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_dist.distributed.config import DDPConfig as _ReferenceConfig

__all__ = ["DDPConfig"]


@dataclass
class DDPConfig(_ReferenceConfig):
    """The reference config, except that any ``bucket_cap_mb`` is kept as given."""

    def __post_init__(self) -> None:
        bucket, self.bucket_cap_mb = self.bucket_cap_mb, None
        super().__post_init__()
        self.bucket_cap_mb = bucket  # the deliberate bug: no check
