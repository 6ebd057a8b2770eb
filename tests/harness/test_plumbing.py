"""Harness layer 0 (no process group, fakes only): what the harness passes on.

The NCCL device id a rank hands ``init_process_group``. These are argument
plumbing checks with fake callables and processes; the distributed behaviour
itself is tested in real worlds (test_world.py) and on GPU hosts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nemo_dist.testing import _rank


def _new_init(backend: str, *, rank: int = 0, device_id: Any = None) -> None:
    """Stands in for torch >= 2.3's init_process_group."""


def _old_init(backend: str, *, rank: int = 0) -> None:
    """Stands in for an init_process_group without device_id."""


@pytest.mark.parametrize(
    ("init", "device", "expected"),
    [
        (_new_init, torch.device("cuda", 1), {"device_id": torch.device("cuda", 1)}),
        (_old_init, torch.device("cuda", 1), {}),
        (_new_init, None, {}),
    ],
    ids=["torch-with-device-id", "older-torch", "no-device-gloo"],
)
def test_nccl_join_passes_the_device_id_where_torch_accepts_it(init: Any, device: Any, expected: dict) -> None:
    """A rank's device reaches init_process_group as device_id only where that parameter exists."""
    assert _rank._device_id_kwargs(init, device) == expected


def test_the_installed_torch_takes_a_device_id() -> None:
    """torch >= 2.4 (the floor in pyproject.toml) accepts device_id: NCCL worlds create communicators at start."""
    import torch.distributed as dist

    assert _rank._device_id_kwargs(dist.init_process_group, torch.device("cuda", 0)) == {
        "device_id": torch.device("cuda", 0)
    }
