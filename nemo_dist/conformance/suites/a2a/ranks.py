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

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.a2a.messages import Dispatched, Exchanged
from nemo_dist.conformance.suites.a2a.target import caller, module_function
from nemo_dist.conformance.suites.gather.ranks import _device, _group, same_bits

__all__ = ["dispatched", "exchanged", "misdirected", "refused", "rows"]


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
) -> Exchanged:
    """One call of the all-to-all: ``matrices[g][i][j]`` rows from group rank i to j of group g; what came of it.

    With ``backward``, the input's gradient and whether the output gradient passed to backward is unchanged.
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
    requires = bool(getattr(out, "requires_grad", False))
    got_grad, grad_intact = None, True
    if backward and isinstance(out, torch.Tensor) and out.requires_grad:
        grad = rows(seed, me + 100 * index, out.shape[0], trailing, dtype, salt=1).to(_device())
        grad_before = grad.clone()
        out.backward(grad)
        got_grad, grad_intact = _cpu(x.grad), same_bits(grad, grad_before)
    return Exchanged(out=_cpu(out), requires_grad=requires, input_intact=same_bits(x.detach(), before),
                     grad=got_grad, grad_intact=grad_intact)


def refused(impl: Implementation, matrix: Sequence[Sequence[int]], case: str) -> tuple[str, str]:
    """One call the ranks disagree on: ``case`` "splits" (rank 0 expects one row more from rank 1 than it is sent)
    or "rows" (rank 0's rows are 3 wide, the others' 2).

    Returns ``(exception type, message)``, or ``("no error", what it returned)``.
    """
    me = dist.get_rank()
    sent = list(matrix[me])
    received = [matrix[i][me] for i in range(len(matrix))]
    if case == "splits" and me == 0:
        received[1] += 1
    width = 3 if case == "rows" and me == 0 else 2
    x = rows(0, me, sum(sent), (width,), torch.float64).to(_device()).requires_grad_()
    return _outcome(lambda: caller(impl)(x, sent, received, dist.group.WORLD))


def _outcome(call: Any) -> tuple[str, str]:
    try:
        out = call()
    except Exception as exc:  # any error of the call: the check asserts every rank raised one
        return type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(out, tuple):
        out = out[0]
    return "no error", f"returned shape {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"


def misdirected(impl: Implementation) -> tuple[str, str]:
    """``dispatch_tokens`` where rank 0 sends its last token to rank ``size`` (outside the group), the others to
    rank 0. Returns ``(exception type, message)``, or ``("no error", what it returned)``."""
    me, size = dist.get_rank(), dist.get_world_size()
    tokens = rows(0, me, 2, (3,), torch.float64).to(_device()).requires_grad_()
    where = torch.tensor([0, size if me == 0 else 0], dtype=torch.int64, device=_device())
    return _outcome(lambda: module_function(impl, "dispatch_tokens")(tokens, where, dist.group.WORLD))


def dispatched(
    impl: Implementation, counts: Sequence[int], destinations: Sequence[Sequence[int]], seed: int
) -> Dispatched:
    """Dispatch this rank's seeded tokens to ``destinations[rank]``, scale on arrival by (receiving rank + 2),
    combine back, and take the gradient of a seeded weighting of the result.
    """
    dispatch, combine = module_function(impl, "dispatch_tokens"), module_function(impl, "combine_tokens")
    me = dist.get_rank() if dist.is_initialized() else 0
    tokens = rows(seed, me, counts[me], (3,), torch.float64).to(_device()).requires_grad_()
    where = torch.tensor(list(destinations[me]), dtype=torch.int64, device=_device())
    received, route = dispatch(tokens, where, dist.group.WORLD if dist.is_initialized() else None)
    combined = combine(received * (me + 2), route)
    weights = rows(seed, me, counts[me], (3,), torch.float64, salt=1).to(_device())
    (combined * weights).sum().backward()
    return Dispatched(received=_cpu(received), combined=_cpu(combined), grad=_cpu(tokens.grad))
