"""Layer 0 (no process group): DDPManager refuses to start outside a world."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from nemo_dist.distributed import DDPConfig, DDPManager


def test_manager_raises_runtime_error_without_process_group() -> None:
    """Constructing a manager with no initialised process group raises RuntimeError saying what to call."""
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DDPManager(DDPConfig())
