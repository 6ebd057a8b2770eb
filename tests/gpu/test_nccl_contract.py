"""Layer 4: NCCL worlds, one GPU per rank; skipped without CUDA.

Every registered conformance check runs against the bundled reference in NCCL
worlds of 1, 2, 4 and 8 ranks (a size larger than the visible GPUs is skipped
with the count); then what only CUDA has: half-precision gathers moved
bit-exact by NCCL, ``DDPManager`` making its GPU current, and DDP's
``device_ids``. Run with ``pytest -m gpu -ra`` (see ``tests/gpu/__init__.py``).
"""

from __future__ import annotations

import pytest
import torch

from nemo_dist.conformance import REFERENCE, Case, cases, is_not_supported, load_checks
from nemo_dist.conformance.suites.gather import ranks as gather_ranks
from nemo_dist.testing.plugin import WorldFactory
from tests.gpu import nccl_rank_fns

pytestmark = pytest.mark.gpu

WORLD_SIZES = (1, 2, 4, 8)


def _cases() -> list[object]:
    """One case per registry case of the reference that needs a world (ddp ones per entry point), per world size.

    Sizes a check does not apply to are skipped marks; checks that need no
    process group run on CPU in the other layers, not here.
    """
    params: list[object] = []
    for case in cases(load_checks().values(), REFERENCE, WORLD_SIZES):
        if case.world_size == 0:
            continue
        marks = [pytest.mark.xdist_group(name=f"nemo_dist_nccl_w{case.world_size}")]
        if not case.applies:
            check = case.check
            bounds = f"{check.min_world}..{check.max_world or 'any'}"
            reason = case.elsewhere or f"{case.name} does not apply to a world of {case.world_size} (sizes {bounds})"
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(case, marks=marks, id=f"{case.name}-w{case.world_size}"))
    return params


@pytest.mark.parametrize("case", _cases())
def test_check_holds_in_nccl_world(case: Case, world_factory: WorldFactory) -> None:
    """The registered check holds for the reference in an NCCL world of this size."""
    world = world_factory(case.world_size, backend="nccl")
    try:
        case.check(world, case.impl)
    except Exception as exc:
        if is_not_supported(exc):
            pytest.skip(f"not supported: {str(exc).splitlines()[0]}")
        raise


def _every_bit_pattern(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """All 65536 bit patterns of a 16-bit float dtype (NaNs, infinities, subnormals, -0), rolled by ``rank``."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.roll(rank * 257).view(dtype).reshape(256, 256)


@pytest.mark.xdist_group(name="nemo_dist_nccl_w2")
@pytest.mark.parametrize("no_grad", [False, True], ids=["with_grad", "no_grad"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_gather_moves_every_bit_pattern_exactly(
    dtype: torch.dtype, no_grad: bool, world_factory: WorldFactory
) -> None:
    """NCCL gathers bf16/fp16 tensors of every bit pattern bit-exact, on every rank, in rank order."""
    world = world_factory(2, backend="nccl")
    inputs = [_every_bit_pattern(dtype, rank) for rank in range(world.size)]
    expected = torch.cat(inputs)
    results = world.run(gather_ranks.forward, REFERENCE, inputs, "contiguous", no_grad=no_grad, requires_grad=False)
    for rank, result in enumerate(results):
        assert result.out.dtype == dtype, f"rank {rank}: output dtype {result.out.dtype}, expected {dtype}"
        assert gather_ranks.same_bits(result.out, expected), f"rank {rank}: gathered bits differ from the inputs"
        assert result.input_intact, f"rank {rank}: the gather modified its input"


@pytest.mark.xdist_group(name="nemo_dist_nccl_w2")
def test_manager_makes_its_own_gpu_current(world_factory: WorldFactory) -> None:
    """DDPManager calls torch.cuda.set_device(rank % device_count), whatever GPU was current before."""
    world = world_factory(2, backend="nccl")
    for rank, got in enumerate(world.run(nccl_rank_fns.manager_after_another_device_was_current)):
        index = rank % got["count"]
        assert got["device"] == f"cuda:{index}", (
            f"rank {rank}: manager.device is {got['device']}, expected cuda:{index}"
        )
        assert got["current"] == index, (
            f"rank {rank}: current CUDA device after DDPManager() is {got['current']}, expected {index}"
        )


@pytest.mark.xdist_group(name="nemo_dist_nccl_w2")
def test_ddp_device_ids_is_the_rank_gpu_and_training_stays_there(world_factory: WorldFactory) -> None:
    """The wrapped DDP has device_ids == [rank % device_count]; parameters, output and gradient live on that GPU."""
    world = world_factory(2, backend="nccl")
    count = torch.cuda.device_count()
    for rank, got in enumerate(world.run(nccl_rank_fns.wrapped_linear_step)):
        index = rank % count
        device = f"cuda:{index}"
        assert got["device_ids"] == [index], f"rank {rank}: DDP device_ids {got['device_ids']!r}, expected [{index}]"
        for what in ("param_device", "out_device", "grad_device"):
            assert got[what] == device, f"rank {rank}: {what} is {got[what]}, expected {device}"
        expected = torch.full((1, 4), float(world.size - 1), dtype=torch.float64)
        assert torch.equal(got["grad"], expected), (
            f"rank {rank}: gradient {got['grad'].tolist()}, expected the average over ranks {expected.tolist()}"
        )
