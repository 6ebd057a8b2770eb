"""What the gather checks share: drawing examples, exact comparison, and the likely-cause hook.

Each gather check draws its inputs in the parent with hypothesis, in a fixed
order (so examples shrink alike), runs rank functions of
:mod:`nemo_dist.conformance.suites.gather.ranks` and compares bit for bit with
:func:`assert_same`. A check wrapped in :func:`diagnosed` re-runs its shrunk
example in variants when it fails and attaches the likely cause
(:mod:`~nemo_dist.conformance.suites.gather.diagnosis`).
"""

from __future__ import annotations

import contextlib
import unittest
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import strategies as st

from nemo_dist.conformance.engine.deadlines import StepAborted, StepBroke, StepHung
from nemo_dist.conformance.engine.errors import NotApplicable, NotSupported
from nemo_dist.conformance.engine.explain import crashed_ranks, grouped
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.gather.ranks import same_bits
from nemo_dist.testing import strategies as ds

__all__ = [
    "LastFailure",
    "assert_same",
    "diagnosed",
    "draw_laid_out_inputs",
    "draw_partition",
    "draw_shape_and_dtype",
    "draw_upstream_grads",
    "error_rows",
    "interleaved_partition",
    "require_no_group",
]


_EXAMPLE = "conformance_example"


class LastFailure:
    """The data of the last failing example of one check run, for the likely-cause diagnosis.

    Hypothesis replays the shrunk example last, so after the property fails
    this holds the example the verdict shows; each exception raised in
    :meth:`record` also carries its own example (hypothesis may report
    several distinct failures).
    """

    def __init__(self) -> None:
        self.example: dict[str, Any] | None = None

    @contextlib.contextmanager
    def record(self, **example: Any) -> Iterator[None]:
        """Remember ``example`` if the body raises, on this object and on the exception (then re-raise)."""
        try:
            yield
        except BaseException as exc:
            self.example = example
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, _EXAMPLE, example)
            raise


def _crashed(exc: BaseException) -> bool:
    """Whether a rank died in ``exc`` (a crash is its own verdict, with no gradient cause over it)."""
    failure = exc.failure if isinstance(exc, StepBroke) else exc
    failures = getattr(failure, "failures", None)
    return isinstance(failures, dict) and bool(crashed_ranks(failures))


def _attach_cause(exc: BaseException, example: dict[str, Any] | None, cause: Callable[[dict[str, Any]], str]) -> None:
    # A hang is its own verdict: re-running the example would only hang again; a crash likewise.
    if example is None or isinstance(exc, (NotSupported, NotApplicable, StepHung)) or _crashed(exc):
        return
    try:
        found = cause(example)
    except (Exception, StepAborted):
        found = ""
    if found:
        exc.likely_cause = found  # type: ignore[attr-defined]


def diagnosed(prop: Callable[[], None], last: LastFailure, cause: Callable[[dict[str, Any]], str]) -> None:
    """Run ``prop``; when it fails, attach ``cause(example)`` of its failing example as ``likely_cause``.

    When hypothesis found several distinct failures, each one gets the cause of its own example.
    """
    try:
        prop()
    except (Exception, StepAborted) as exc:
        failures = grouped(exc)
        if failures:
            for sub in failures:
                _attach_cause(sub, getattr(sub, _EXAMPLE, None), cause)
        else:
            _attach_cause(exc, getattr(exc, _EXAMPLE, last.example), cause)
        raise


def assert_same(got: Any, expected: torch.Tensor, what: str) -> None:
    """Assert ``got`` is a tensor of ``expected``'s dtype, shape and bits; messages start with ``what``."""
    assert isinstance(got, torch.Tensor), f"{what}: got {got!r}, expected a tensor"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert tuple(got.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    )
    assert same_bits(got, expected), f"{what}: values differ\ngot\n{got}\nexpected\n{expected}"


def error_rows(results: Sequence[tuple[str, str]]) -> str:
    """One line per rank of :func:`~.ranks.raises` results: what its call raised, or that it raised nothing.

    ``  rank 0: raised ValueError: ...`` or ``  rank 1: raised nothing; returned shape (2,)``.
    """
    return "\n".join(
        f"  rank {r}: raised nothing; {message}" if kind == "no error" else f"  rank {r}: raised {kind}: {message}"
        for r, (kind, message) in enumerate(results)
    )


def draw_shape_and_dtype(
    data: st.DataObject, dtypes: st.SearchStrategy[torch.dtype]
) -> tuple[tuple[int, ...], torch.dtype]:
    """Draw a shape, then a dtype of ``dtypes``."""
    shape = data.draw(ds.shapes(), label="shape")
    return shape, data.draw(dtypes, label="dtype")


def draw_laid_out_inputs(
    data: st.DataObject, world: WorldLike, dtypes: st.SearchStrategy[torch.dtype], values: ds.Values = "integers"
) -> tuple[tuple[int, ...], torch.dtype, str, list[torch.Tensor]]:
    """Draw shape, dtype, memory layout and every rank's input, in that order (so examples shrink alike)."""
    shape, dtype = draw_shape_and_dtype(data, dtypes)
    layout = data.draw(ds.layouts(shape), label="layout")
    inputs = data.draw(ds.rank_tensors(world.size, shape, dtype, values=values), label="inputs")
    return shape, dtype, layout, inputs


def draw_upstream_grads(
    data: st.DataObject, world: WorldLike, shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[tuple[int, ...], list[torch.Tensor], str]:
    """Draw every rank's upstream gradient for the gathered shape and its layout; return them with that shape."""
    out_shape = (world.size * shape[0], *shape[1:])
    grads = data.draw(ds.upstream_grads(world.size, out_shape, dtype), label="upstream grads")
    grad_layout = data.draw(ds.layouts(out_shape), label="grad_layout")
    return out_shape, grads, grad_layout


def draw_partition(data: st.DataObject, size: int) -> list[list[int]]:
    """Draw a split of ranks ``0..size-1`` into two non-empty groups, of contiguous or interleaved ranks.

    Each group's ranks ascend and the groups are listed by their first rank
    (``[[0, 2], [1, 3]]``); shrinks toward ``[[0], [1, ..., size-1]]``.
    """
    first = data.draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=size - 1), label="a group's ranks")
    rest = [r for r in range(size) if r not in first]
    return sorted([sorted(first), rest])


def interleaved_partition(size: int) -> list[list[int]]:
    """The even and the odd ranks of ``0..size-1`` (``[[0, 2], [1]]`` of 3, ``[[0, 2], [1, 3]]`` of 4).

    A rank's group rank is then its global rank halved, never its global rank
    minus its group's first member.
    """
    return [list(range(0, size, 2)), list(range(1, size, 2))]


def require_no_group() -> None:
    """Skip (``unittest.SkipTest``) when this process is a rank of a world: the check needs one without a group."""
    if dist.is_available() and dist.is_initialized():
        raise unittest.SkipTest("this process is a rank of a world (torchrun); the check needs one without a group")
