"""What the DDP checks expect: the layer groups each scope selects, the tolerances, and how results are compared.

Shared by the hand-made DDP checks (:mod:`~nemo_dist.conformance.suites.ddp.checks`)
and the real-model checks (:mod:`~nemo_dist.conformance.suites.real_models.checks`).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_dist.conformance.suites.ddp.messages import AutocastOps, Placement

__all__ = [
    "CHECKPOINT_SCOPES",
    "COMPUTE_ROUNDINGS",
    "EXPECTED_GROUPS",
    "TOLERANCE_BF16",
    "TOLERANCE_FLOAT32",
    "TOLERANCE_FLOAT64",
    "TOLERANCE_TIGHT",
    "assert_autocast_grads",
    "assert_close_lists",
    "assert_close_rounded",
    "assert_device_placement",
    "assert_ranks_identical",
    "checkpoint_role",
    "computed_in",
    "lists_plainly_close",
    "rounding_tolerance",
    "tolerance_for",
    "unit_roundoff",
]

#: Scopes the checkpointing check runs, and the layer groups each selects.
EXPECTED_GROUPS: dict[str, set[str]] = {
    "all": {"language", "vision", "audio"},
    "language": {"language"},
    "vision": {"vision"},
    "audio": {"audio"},
    "multimodal": {"vision", "audio"},
    "language,vision": {"language", "vision"},
}
CHECKPOINT_SCOPES = tuple(EXPECTED_GROUPS)

#: DDP vs one process on the full batch, float64 models (reduction order differs).
TOLERANCE_FLOAT64 = {"atol": 1e-10, "rtol": 1e-10}
#: The same under bf16 autocast (8-bit mantissa: ~4e-3 relative per op, 2 steps).
TOLERANCE_BF16 = {"atol": 1e-2, "rtol": 1e-2}
#: Roundings a comparison computed below float64 allows, of the largest value compared: a few steps' forward and
#: backward round each value a handful of times. A bfloat16 mixed-precision FSDP2 measured at most 4.2 of them
#: (world sizes 1-4, 12 seeds of each data kind and row count, every wrapper training comparison).
COMPUTE_ROUNDINGS = 32
#: Two computations that should agree but for summation order (one process, float64).
TOLERANCE_TIGHT = {"atol": 1e-12, "rtol": 1e-12}
#: Either comparison computed in float32 (a wrapper that casts the model): float32 rounding of a few sums.
TOLERANCE_FLOAT32 = {"atol": 1e-5, "rtol": 1e-5}


def _plainly_close(a: Any, e: Any, tolerance: dict[str, float]) -> bool:
    """Whether two floating-point tensors of equal dtype, shape and device agree within ``atol + rtol * |e|``.

    ``torch.testing.assert_close`` passes wherever this is True (the same rule,
    NaN never close); as it costs far more per call, it is asked only where
    this is False, to decide and word the failure.
    """
    if not _comparable(a, e):
        return False
    return bool(torch.isclose(a, e, rtol=tolerance["rtol"], atol=tolerance["atol"]).all())


def _comparable(a: Any, e: Any) -> bool:
    """Whether ``a`` and ``e`` are strided floating-point tensors of one dtype, shape and device."""
    if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
        return False
    if (a.dtype, a.shape, a.device, a.layout) != (e.dtype, e.shape, e.device, e.layout) or a.layout != torch.strided:
        return False
    return a.dtype.is_floating_point


def lists_plainly_close(actual: list[Any], expected: list[Any], tolerance: dict[str, float]) -> bool:
    """Whether two lists of tensors (None allowed) agree pairwise by :func:`_plainly_close`, in one comparison.

    The same rule as asking each pair, without a comparison per pair: every
    pair is flattened into one vector per dtype. False (ask pair by pair) when
    the lists differ in length, a None is unpaired, or a pair differs in dtype,
    shape, device or layout.
    """
    if len(actual) != len(expected):
        return False
    flat: dict[Any, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for a, e in zip(actual, expected, strict=True):
        if a is None or e is None:
            if a is not e:
                return False
            continue
        if not _comparable(a, e):
            return False
        pairs = flat.setdefault((a.dtype, a.device), ([], []))
        pairs[0].append(a.reshape(-1))
        pairs[1].append(e.reshape(-1))
    return all(
        bool(torch.isclose(torch.cat(a), torch.cat(e), rtol=tolerance["rtol"], atol=tolerance["atol"]).all())
        for a, e in flat.values()
    )


def assert_close_lists(actual: list[Any], expected: list[Any], what: str, tolerance: dict[str, float]) -> None:
    """Assert two lists of tensors (None allowed) agree within ``tolerance``; messages start with ``what``."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, expected {len(expected)}"
    if lists_plainly_close(actual, expected, tolerance):
        return
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a is None or e is None:
            assert a is e, f"{what}: tensor {index} is {a!r}, expected {e!r}"
            continue
        if _plainly_close(a, e, tolerance):
            continue
        try:
            torch.testing.assert_close(a, e, atol=tolerance["atol"], rtol=tolerance["rtol"])
        except AssertionError as error:
            raise AssertionError(f"{what}, tensor {index}: {error}") from None


def assert_ranks_identical(per_rank: list[list[torch.Tensor]], what: str) -> None:
    """Assert every rank's tensors equal rank 0's bit for bit (DDP keeps replicas identical)."""
    for rank, tensors in enumerate(per_rank[1:], start=1):
        for index, (a, b) in enumerate(zip(tensors, per_rank[0], strict=True)):
            assert torch.equal(a, b), (
                f"{what}: parameter {index} on rank {rank} differs from rank 0 "
                f"(max |diff| {(a - b).abs().max().item():.3g}); DDP ranks must stay bit-identical"
            )


def assert_device_placement(got: Placement, rank: int, what: str) -> None:
    """Assert where rank ``rank`` placed its model (:func:`~.ranks.placement`); messages start with ``what``.

    NCCL with CUDA: parameters on ``cuda:(rank % count)``, made current, DDP ``device_ids == [index]``; else CPU.
    """
    if "nccl" in got.backend and got.cuda_count > 0:
        index = rank % got.cuda_count
        device = f"cuda:{index}"
        where = f"{what}: on NCCL with {got.cuda_count} GPU(s)"
        assert got.current_device == index, (
            f"{where}, the current CUDA device afterwards is {got.current_device}, expected {index} "
            "(the entry point must call torch.cuda.set_device)"
        )
        assert got.param_devices == [device], f"{where}, parameters on {got.param_devices}, expected {device}"
        if got.is_ddp:
            assert got.device_ids == [index], (
                f"{where}, DDP device_ids is {got.device_ids!r} (as indices), expected [{index}]"
            )
        return
    where = f"{what}: on {got.backend}"
    assert got.param_devices == ["cpu"], f"{where}, parameters on {got.param_devices}, expected cpu"
    if got.is_ddp:
        assert got.device_ids is None, f"{where}, DDP device_ids is {got.device_ids!r}, expected None on CPU"


def checkpoint_role(mode: bool | str, trainable: bool, group: str, scope: str) -> tuple[bool, str]:
    """Whether checkpointing in ``mode`` with ``scope`` selects a block of ``group``, and how failures name it."""
    if mode and trainable and group in EXPECTED_GROUPS[scope]:
        return True, "a selected trainable block"
    if not mode:
        return False, "a block, with checkpointing off"
    return False, "a frozen block" if not trainable else "an unselected block"


def tolerance_for(dtype: str, tolerance: dict[str, float]) -> dict[str, float]:
    """``tolerance``, or the looser one of the dtype the ranks computed in: :data:`TOLERANCE_BF16` for a
    half-precision dtype, :data:`TOLERANCE_FLOAT32` for float32.

    ``dtype`` is the model's parameter dtype as a rank reported it
    (``"torch.bfloat16"``): an entry point that casts the model (upstream in a
    world of one on CUDA, a wrapper calling ``model.float()``) is compared in
    its own precision, never crashed on.
    """
    if dtype in ("torch.bfloat16", "torch.float16"):
        return TOLERANCE_BF16
    if dtype == "torch.float32" and tolerance["rtol"] < TOLERANCE_FLOAT32["rtol"]:
        return TOLERANCE_FLOAT32
    return tolerance


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of one rounding to ``dtype``: half its machine epsilon (2^-8 for bfloat16)."""
    return torch.finfo(dtype).eps / 2


def rounding_tolerance(dtype: torch.dtype, roundings: int, scale: float) -> dict[str, float]:
    """The tolerance of a value reached through ``roundings`` roundings to ``dtype``, among values of size ``scale``.

    Each rounding errs by at most the unit roundoff ``u`` of what it rounds,
    and errors add up along the computation, so two runs that round
    differently (another split of the batch, another order) may differ by
    ``roundings * u`` times the size of the values that flowed in:
    ``atol = roundings * u * scale`` and ``rtol = roundings * u``.
    """
    u = unit_roundoff(dtype)
    return {"atol": roundings * u * scale, "rtol": roundings * u}


def _largest(tensors: list[Any]) -> float:
    sizes = [float(t.detach().abs().max()) for t in tensors if isinstance(t, torch.Tensor) and t.numel()]
    return max(sizes, default=0.0)


def assert_close_rounded(
    actual: list[Any], expected: list[Any], what: str, dtype: torch.dtype, roundings: int, *, per_tensor: bool
) -> None:
    """:func:`assert_close_lists` within :func:`rounding_tolerance` of ``dtype`` and ``roundings``.

    The scale is each expected tensor's largest entry (``per_tensor``), or
    the largest entry of all of them (rounding errors of a parameter after a
    step come from values that flowed through the whole model). Messages
    start with ``what`` and say how the tolerance was derived.
    """
    assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, expected {len(expected)}"
    name = str(dtype).removeprefix("torch.")
    whole = _largest(expected)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        scale = _largest([e]) if per_tensor else whole
        tolerance = rounding_tolerance(dtype, roundings, scale)
        if (a is None and e is None) or _plainly_close(a, e, tolerance):
            continue
        derived = (
            f"tolerance derived from {roundings} roundings to {name} (unit roundoff {unit_roundoff(dtype):.3g}) "
            f"on values up to {scale:.3g}: atol {tolerance['atol']:.3g}, rtol {tolerance['rtol']:.3g}"
        )
        assert a is not None, f"{what}: tensor {index} is None, expected {e!r}"
        assert e is not None, f"{what}: tensor {index} is {a!r}, expected None"
        try:
            torch.testing.assert_close(a, e, atol=tolerance["atol"], rtol=tolerance["rtol"])
        except AssertionError as error:
            raise AssertionError(f"{what}, tensor {index} ({derived}): {error}") from None


def assert_autocast_grads(got: AutocastOps, what: str, dtype: torch.dtype | None) -> None:
    """The wrapped gradients equal torch.autocast's on the full batch, within the rounding the autocast dtype allows.

    The two runs round differently (another split of the batch): each matmul
    of forward and backward rounds its output to ``dtype``, so the tolerance
    is that many roundings of the dtype, on the size of each gradient tensor
    (:func:`rounding_tolerance`). float32 (None) allows the
    same count of float32 roundings (TF32 matmuls on a GPU round coarser:
    their unit roundoff is 2^-11, as float16's).
    """
    roundings = len(got.matmuls) + len(got.backward_matmuls)
    if dtype is None:
        dtype = torch.float16 if torch.cuda.is_available() else torch.float32
    assert_close_rounded(
        got.grads, got.reference, f"{what}: gradients vs an explicit torch.autocast", dtype, roundings,
        per_tensor=True,
    )


def computed_in(dtype: str, declared: str | None) -> torch.dtype:
    """The dtype a rank's arithmetic ran in: the parameters' ``dtype`` (``"torch.float32"``, as a rank reports it)
    or the declared compute dtype (``--ddp-compute-dtype``, ``"bfloat16"``; None: none), whichever is less precise."""
    found = [getattr(torch, dtype.removeprefix("torch."))]
    if declared is not None:
        found.append(getattr(torch, declared))
    return max(found, key=lambda d: torch.finfo(d).eps)
