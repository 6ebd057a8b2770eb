"""How many GPUs this process can use for NCCL worlds, and what a world of a given size lacks.

One answer for every front end (the pytest plugin, the conformance command).
``NEMO_DIST_FAKE_GPU_COUNT=N`` is a testing seam only: N is taken as the
visible GPU count (0: no CUDA), so the size selection and its messages are
provable on a machine without a GPU.
"""

from __future__ import annotations

import os

from nemo_dist.testing import options

__all__ = ["FAKE_GPU_COUNT_ENV", "missing_gpus", "visible_gpu_count"]

#: The testing seam's environment variable.
FAKE_GPU_COUNT_ENV = "NEMO_DIST_FAKE_GPU_COUNT"

_COUNTED: list[int] = []


def visible_gpu_count() -> int:
    """Visible GPUs: ``NEMO_DIST_FAKE_GPU_COUNT`` when set, else torch's count (0 without CUDA).

    Raises ``options.BadOptionValue`` when the seam holds no int >= 0.
    Imports torch on first use only.
    """
    text = os.environ.get(FAKE_GPU_COUNT_ENV)
    if text is not None:
        return options.parse_count(text)
    if not _COUNTED:
        import torch

        _COUNTED.append(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return _COUNTED[0]


def missing_gpus(size: int | None = None) -> str | None:
    """What an NCCL world (of ``size`` ranks, one GPU each, if given) lacks here, or None."""
    count = visible_gpu_count()
    if count == 0:
        return "CUDA is not available (torch.cuda.is_available() is False)"
    if size is not None and count < size:
        return f"an NCCL world of {size} needs {size} GPUs, {count} visible"
    return None
