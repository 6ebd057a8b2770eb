"""Broken config fork (test fixture): ``bucket_cap_mb=True`` is accepted (a bool is an int to ``isinstance``).

Guarded by ``config.rejects_bad_values_naming_field``: a bool bucket size must fail naming the field.
"""

from __future__ import annotations

from tests.forks import config_keeping

__all__ = ["DDPConfig"]

DDPConfig = config_keeping(
    "bucket_cap_mb",
    lambda given: isinstance(given, bool),
    "The reference config, except that a bool bucket_cap_mb is kept (True as 1 MiB).",
)
