"""Broken config fork (test fixture): ``autocast_dtype=torch.int32`` (any torch dtype) is accepted.

Guarded by ``config.rejects_bad_values_naming_field``: autocast needs a floating-point dtype, so an integer dtype must
fail naming the field.
"""

from __future__ import annotations

import torch

from tests.forks import config_keeping

__all__ = ["DDPConfig"]

DDPConfig = config_keeping(
    "autocast_dtype",
    lambda given: isinstance(given, torch.dtype),
    "The reference config, except that any torch.dtype is a valid autocast_dtype.",
)
