"""Broken config fork (test fixture): ``bucket_cap_mb=float("nan")`` is accepted.

``value <= 0`` is False for NaN, so a check written that way lets it through.

Guarded by ``config.rejects_bad_values_naming_field``: a NaN bucket size must fail naming the field.
"""

from __future__ import annotations

import math

from tests.forks import config_keeping

__all__ = ["DDPConfig"]

DDPConfig = config_keeping(
    "bucket_cap_mb",
    lambda given: isinstance(given, float) and math.isnan(given),
    "The reference config, except that a NaN bucket_cap_mb is kept as given.",
)
