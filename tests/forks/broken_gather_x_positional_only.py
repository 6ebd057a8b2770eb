"""Broken gather fork: ``all_gather_no_grad(x, /, group=None, uneven=False)``, x positional-only.

Otherwise the reference. ``*`` written as ``/``: a caller passing ``x=`` gets
a TypeError, and ``group``/``uneven`` may now be passed by position. Guarded
by ``gather.takes_x_by_keyword`` (extended): the documented signature is
``all_gather_no_grad(x)``.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.loss.dist_utils import all_gather_no_grad as _reference_no_grad
from nemo_dist.loss.dist_utils import all_gather_with_grad

__all__ = ["all_gather_no_grad", "all_gather_with_grad"]


def all_gather_no_grad(x: torch.Tensor, /, group: Any = None, uneven: bool = False) -> torch.Tensor:
    """The reference's, with ``x`` positional-only (the deliberate bug)."""
    return _reference_no_grad(x, group=group, uneven=uneven)
