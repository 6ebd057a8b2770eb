"""Rank side of the a2a checks: one all-to-all (or a dispatch and combine) on seeded rows, what came of it reported.

Every rank's rows are made from the example's seed (:func:`rows`), so the
parent rebuilds them to compute what each rank should receive. A rank
reports its output and, when the check asks for it, its input's gradient
after backward from seeded output gradients, whether the caller's tensors
are unchanged, and errors where a check expects them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from nemo_dist.conformance.a2a.target import caller, module_function
from nemo_dist.conformance.gather.ranks import _device, _group, same_bits
from nemo_dist.conformance.implementation import Implementation

__all__ = ["dispatched", "exchanged", "refused", "rows"]


def rows(seed: int, rank: int, count: int, trailing: Sequence[int], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s ``count`` seeded rows of shape ``trailing`` in ``dtype`` (``salt`` 1: its gradients)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + salt)
    return torch.randn((count, *trailing), generator=generator, dtype=torch.float64).to(dtype)


def _in_group(partition: Sequence[Sequence[int]] | None) -> tuple[Any, int]:
    """This rank's group among ``partition`` (None: the whole world's) and its index among the partition's groups."""
    if partition is None:
        return dist.group.WORLD if dist.is_initialized() else None, 0
    me = dist.get_rank()
    return _group(partition), next(i for i, members in enumerate(partition) if me in members)


def _cpu(tensor: Any) -> Any:
    return tensor.detach().cpu() if isinstance(tensor, torch.Tensor) else tensor


def exchanged(
    impl: Implementation,
    matrices: Sequence[Sequence[Sequence[int]]],
    trailing: Sequence[int],
    dtype: torch.dtype,
    seed: int,
    *,
    requires_grad: bool = True,
    backward: bool = False,
    partition: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """One call of the all-to-all: ``matrices[g][i][j]`` rows from group rank i to j of group g; what came of it.

    Returns ``out``, ``requires_grad``, ``input_intact`` and, with ``backward``,
    ``grad`` (the input's, None if it got none) and ``grad_intact`` (the output
    gradient passed to backward unchanged).
    """
    group, index = _in_group(partition)
    matrix = matrices[index]
    me = dist.get_rank(group) if dist.is_initialized() else 0
    sent = list(matrix[me])
    received = [matrix[i][me] for i in range(len(matrix))]
    x = rows(seed, me + 100 * index, sum(sent), trailing, dtype).to(_device())
    before = x.clone()
    x.requires_grad_(requires_grad)
    out = caller(impl)(x, sent, received, group)
    found: dict[str, Any] = {"out": _cpu(out), "requires_grad": bool(getattr(out, "requires_grad", False))}
    if backward and isinstance(out, torch.Tensor) and out.requires_grad:
        grad = rows(seed, me + 100 * index, out.shape[0], trailing, dtype, salt=1).to(_device())
        grad_before = grad.clone()
        out.backward(grad)
        found["grad"] = _cpu(x.grad)
        found["grad_intact"] = same_bits(grad, grad_before)
    elif backward:
        found["grad"] = None
        found["grad_intact"] = True
    found["input_intact"] = same_bits(x.detach(), before)
    return found


def refused(impl: Implementation, matrix: Sequence[Sequence[int]], off_by_one: tuple[int, int]) -> tuple[str, str]:
    """One call where rank ``off_by_one[0]`` expects one row more from rank ``off_by_one[1]`` than it is sent.

    Returns ``(exception type, message)``, or ``("no error", what it returned)``.
    """
    me = dist.get_rank()
    sent = list(matrix[me])
    received = [matrix[i][me] for i in range(len(matrix))]
    if me == off_by_one[0]:
        received[off_by_one[1]] += 1
    x = rows(0, me, sum(sent), (2,), torch.float64).to(_device()).requires_grad_()
    try:
        out = caller(impl)(x, sent, received, dist.group.WORLD)
    except Exception as exc:  # any error of the call: the check asserts every rank raised one
        return type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "no error", f"returned shape {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"


def dispatched(
    impl: Implementation, counts: Sequence[int], destinations: Sequence[Sequence[int]], seed: int
) -> dict[str, Any]:
    """Dispatch this rank's seeded tokens to ``destinations[rank]``, scale on arrival by (receiving rank + 2),
    combine back, and take the gradient of a seeded weighting of the result.

    Returns ``received`` (what arrived), ``combined`` and the tokens' ``grad``.
    """
    dispatch, combine = module_function(impl, "dispatch_tokens"), module_function(impl, "combine_tokens")
    me = dist.get_rank() if dist.is_initialized() else 0
    tokens = rows(seed, me, counts[me], (3,), torch.float64).to(_device()).requires_grad_()
    where = torch.tensor(list(destinations[me]), dtype=torch.int64, device=_device())
    received, route = dispatch(tokens, where, dist.group.WORLD if dist.is_initialized() else None)
    combined = combine(received * (me + 2), route)
    weights = rows(seed, me, counts[me], (3,), torch.float64, salt=1).to(_device())
    (combined * weights).sum().backward()
    return {"received": _cpu(received), "combined": _cpu(combined), "grad": _cpu(tokens.grad)}
