"""Layer 2: gloo worlds of 2 and 3 ranks. The DDP and config checks fail on broken forks and pass an independent one.

Each broken fork in ``tests/forks/`` carries one deliberate bug; the check that
guards against it must raise ``AssertionError`` with a message naming the broken
property. ``tests/forks/independent_ddp.py`` and ``independent_config.py``, written
from the SPEC without nemo_dist code, must pass every ddp and config check.
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance import config_checks, ddp_checks
from nemo_dist.conformance._impl import REFERENCE, Implementation
from nemo_dist.conformance._registry import CHECKS, Check
from nemo_dist.testing.plugin import WorldFactory

INDEPENDENT = Implementation(
    gather="tests.forks.independent_gather",
    ddp="tests.forks.independent_ddp",
    config="tests.forks.independent_config",
)


def _ddp_fork(name: str) -> Implementation:
    return Implementation(gather=REFERENCE.gather, ddp=f"tests.forks.{name}", config=REFERENCE.config)


BROKEN_DDP: list[tuple[str, Check, str]] = [
    ("broken_ddp_drops_bucket_cap", ddp_checks.bucket_cap_mb, r"bucket_cap_mb=0\.01 gave 1 bucket\(s\), not more than"),
    (
        "broken_ddp_forward_sync_buffers",
        ddp_checks.broadcast_buffers,
        r"broadcast_buffers=False: rank 1's buffer after init is 0, expected 1",
    ),
    (
        "broken_ddp_no_checkpointing",
        ddp_checks.activation_checkpointing_full,
        r"language\.0 \(a selected trainable block\) ran attn 0x and mlp 0x during backward",
    ),
    (
        "broken_ddp_no_checkpointing",
        ddp_checks.activation_checkpointing_selective,
        r"activation_checkpointing='selective'.*ran attn 0x",
    ),
]


@pytest.mark.parametrize(
    ("fork", "guard", "message"), BROKEN_DDP, ids=[f"{fork}-{guard.name}" for fork, guard, _ in BROKEN_DDP]
)
def test_guarding_check_fails_on_broken_ddp_fork(
    world_factory: WorldFactory, fork: str, guard: Check, message: str
) -> None:
    """The check guarding against the DDP fork's bug raises AssertionError naming the broken property."""
    with pytest.raises(AssertionError, match=message):
        guard(world_factory(2), _ddp_fork(fork))


def test_config_check_fails_on_config_accepting_negative_bucket() -> None:
    """The bad-values check rejects a config fork that accepts bucket_cap_mb=-1.0."""
    fork = Implementation(config="tests.forks.broken_config_accepts_negative_bucket")
    with pytest.raises(AssertionError, match=r"DDPConfig\(bucket_cap_mb=-1\.0\) was accepted"):
        config_checks.rejects_bad_values_naming_field(None, fork)


DDP_CASES = [
    pytest.param(c, size, id=f"{c.name}-{size}")
    for c in CHECKS.values()
    if c.component == "ddp" and c.needs_world
    for size in (2, 3)
    if c.applies_to(size)
]
WORLDLESS_CHECKS = [c for c in CHECKS.values() if c.component in ("ddp", "config") and not c.needs_world]


@pytest.mark.parametrize(("check", "size"), DDP_CASES)
def test_independent_fork_passes_every_ddp_check(world_factory: WorldFactory, check: Check, size: int) -> None:
    """A correct DDP manager written from the SPEC alone passes every ddp check in worlds of 2 and 3."""
    check(world_factory(size), INDEPENDENT)


@pytest.mark.parametrize("check", WORLDLESS_CHECKS, ids=[c.name for c in WORLDLESS_CHECKS])
def test_independent_fork_passes_every_check_without_a_world(check: Check) -> None:
    """A correct DDPConfig and DDPManager written from the SPEC alone pass every check that needs no world."""
    check(None, INDEPENDENT)
